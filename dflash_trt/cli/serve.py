"""`dflash-trt serve`: run tritonserver on a model repository until Ctrl-C (thin command)."""

from __future__ import annotations

import click


@click.command("serve", short_help="Run tritonserver on a repository until Ctrl-C.")
@click.argument("repository", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (all three endpoints).")
@click.option("--http-port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=8002, show_default=True)
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="Server log file (default: the server's output goes to this terminal).")
def serve_command(repository, host, http_port, grpc_port, metrics_port, log_path):
    """Start tritonserver (system install or the nvidia-pytriton binary), wait until ready, keep it serving
    (a dead server or model process is restarted, with back-off), stop on Ctrl-C or SIGTERM."""
    import signal
    import threading

    from dflash_trt.triton.server import Ports, TritonServer
    from dflash_trt.triton.supervisor import Supervisor

    try:
        server = TritonServer(repository, host, Ports(http_port, grpc_port, metrics_port), log_path)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    for name in server.ignored:
        click.echo(f"warning: {repository}/{name}: not a model folder (a leftover of an interrupted publish?); "
                   "ignored", err=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with server:
        click.echo(f"ready: grpc {server.grpc_url}  http {server.url}  metrics {host}:{metrics_port}  (Ctrl-C stops)")
        supervisor = Supervisor(server, on_event=lambda message: click.echo(f"supervisor: {message}", err=True))
        try:
            supervisor.watch(stopped)  # restarts a dead server or model process, boundedly; raises past the budget
        except KeyboardInterrupt:
            pass
        click.echo("stopping tritonserver")
