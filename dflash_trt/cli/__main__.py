"""`python -m dflash_trt.cli`: the same as the `dflash-trt` command."""

from dflash_trt.cli import main

main()
