"""dflash-trt: build, serve and benchmark DFlash speculative decoding.

DFlash (arXiv 2602.06036) drafts a whole block of tokens in one forward pass of a small
block-diffusion model that reads the target's hidden states; the target verifies the block in
one pass. `import dflash_trt` stays light: torch, transformers and GPU stacks are imported by
the modules that need them.
"""

__version__ = "0.1.0"
