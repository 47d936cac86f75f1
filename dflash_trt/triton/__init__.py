"""Triton Inference Server integration: repository rendering, server launcher, orchestrator, client."""
