"""The torch backend: the models' own forwards (CUDA first; any device), runners and bundles."""
