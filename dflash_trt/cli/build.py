"""`dflash-trt build`, `publish` and `regress`: the bundle and repository stages (thin commands)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("build", short_help="Build an engine bundle from CONFIG.yaml (and publish it with --publish).")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--publish/--no-publish", default=True, show_default=True,
              help="Also render the Triton repository named by the config's `repository`.")
def build_command(config, publish):
    """convert -> build -> bundle (manifest, hashes, golden outputs) -> publish; atomic and reused when unchanged."""
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.runtime.build import build
    from dflash_trt.triton.repository import publish as publish_repo

    cfg = load_build_config(config)
    path, manifest, reused = build(cfg, log=lambda m: click.echo(m, err=True))
    golden = manifest["golden"]
    click.echo(f"bundle: {path} ({'reused' if reused else 'built'}, {manifest['size_bytes'] / 1e6:.1f} MB, "
               f"golden τ {golden['mean_acceptance_length']:.2f})")
    if publish:
        click.echo(f"repository: {publish_repo(path, cfg.repository_path())}")


@click.command("publish", short_help="Render a Triton model repository for a bundle.")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.argument("repository", type=click.Path(file_okay=False))
@click.option("--device", help="Override the bundle's runtime device (cpu, cuda, cuda:N).")
@click.option("--max-batch-size", type=click.IntRange(min=1), help="Override the bundle's slot count.")
def publish_command(bundle, repository, device, max_batch_size):
    """Verify the bundle's hashes, then (re)write REPOSITORY/dflash atomically."""
    from dflash_trt.triton.repository import publish

    click.echo(f"repository: {publish(bundle, repository, device=device, max_batch_size=max_batch_size)}")


@click.command("regress", short_help="Rebuild presets and compare with committed baselines.")
@click.argument("configs", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--baselines", type=click.Path(file_okay=False), default="build_configs/baselines", show_default=True)
@click.option("--update", is_flag=True, help="Rewrite the baselines from this build.")
def regress_command(configs, baselines, update):
    """Rebuild every preset this machine can build (default: build_configs/*.yaml); fail on any regression."""
    from dflash_trt.engine.regress import print_table, regress_one
    from dflash_trt.runtime.build import build

    paths = [Path(c) for c in configs] or sorted(Path("build_configs").glob("*.yaml"))
    if not paths:
        raise click.UsageError("no configs given and none in build_configs/")
    outcomes = [regress_one(p, Path(baselines), update, build, log=lambda m: click.echo(m, err=True)) for p in paths]
    print_table(outcomes)
    failed = [o.name for o in outcomes if o.status == "fail"]
    if failed:
        raise click.ClickException(f"regression in {', '.join(failed)}")
