"""The Triton model repository templates `dflash-trt publish` renders (see README.md here).

A package only so that the templates install with dflash-trt (pyproject maps it to
`dflash_trt.triton_model_repo`); nothing imports it: `triton/repository.py` finds the folder.
"""
