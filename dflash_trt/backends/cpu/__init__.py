"""The CPU backend: the torch models' passes through the C++ layer (cpu_kernels/decoder_layer.cpp).

ops.py builds and loads the C++ library and wraps its row-independent ops; layers.py runs decoder
layers through it; target.py (with the lazy verify) and draft.py are the models' passes; runners.py the
runner contract over them.
"""
