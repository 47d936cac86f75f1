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
@click.option("--front/--no-front", default=True, show_default=True,
              help="Serve the HTTP port through dflash-trt's guarded front (body and JSON-depth limits, strict "
                   "generate fields, cancel on disconnect); --no-front exposes Triton's own HTTP server.")
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=8 << 20, show_default=True,
              help="The front's largest request body.")
@click.option("--openai-port", type=click.IntRange(1, 65535),
              help="Also serve OpenAI's API (/v1/models, /v1/completions, /v1/chat/completions) on this port; the "
                   "front's HTTP port serves it too. Model ids are the Triton model names (dflash, dflash_ar).")
def serve_command(repository, host, http_port, grpc_port, metrics_port, log_path, front, max_body_bytes, openai_port):
    """Start tritonserver (system install or the nvidia-pytriton binary), wait until ready, keep it serving
    (a dead server or model process is restarted, with back-off), stop on Ctrl-C or SIGTERM."""
    import signal
    import threading

    from dflash_trt.triton.server import Ports, TritonServer, free_port
    from dflash_trt.triton.supervisor import Supervisor

    triton_http = free_port() if front else http_port  # behind the front: a private loopback port
    try:
        server = TritonServer(repository, host, Ports(triton_http, grpc_port, metrics_port), log_path,
                              http_host="127.0.0.1" if front else host)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    for name in server.ignored:
        click.echo(f"warning: {repository}/{name}: not a model folder (a leftover of an interrupted publish?); "
                   "ignored", err=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    if openai_port is not None and not front:
        raise click.UsageError("--openai-port is served by the front: drop --no-front")
    with server:
        fronts = [_start_front(server, host, port, max_body_bytes)
                  for port in ([http_port] + ([openai_port] if openai_port else []) if front else [])]
        try:
            openai = f"  openai http://{host}:{openai_port}/v1" if openai_port else ""
            click.echo(f"ready: grpc {server.grpc_url}  http {host}:{http_port}  metrics {host}:{metrics_port}{openai}  "
                       "(Ctrl-C stops)")
            supervisor = Supervisor(server, on_event=lambda message: click.echo(f"supervisor: {message}", err=True))
            supervisor.watch(stopped)  # restarts a dead server or model process, boundedly; raises past the budget
        except KeyboardInterrupt:
            pass
        finally:
            for http in fronts:
                http.stop()
        click.echo("stopping tritonserver")


def _start_front(server, host: str, port: int, max_body_bytes: int):
    from dflash_trt.triton.front import FrontLimits
    from dflash_trt.triton.front_app import Front, make_app
    from dflash_trt.triton.repository import ENSEMBLE_MODEL_NAME, is_published_model

    published = frozenset(m for m in server.models if is_published_model(server.repository / m))
    ensembles = published & {ENSEMBLE_MODEL_NAME}
    app = make_app(server.url, f"127.0.0.1:{server.ports.grpc}", published - ensembles,
                   FrontLimits(max_body_bytes=max_body_bytes), ensembles)
    try:
        return Front(app, host, port).start()
    except RuntimeError as exc:
        raise click.ClickException(f"{exc} ({host}:{port})") from None
