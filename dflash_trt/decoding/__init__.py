"""The DFlash algorithm: sampling rule, verification and the reference decode loops.

DFlash ("DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036, reference code
z-lab/dflash) drafts a whole block in ONE forward pass of a small block-diffusion model and lets
the target verify that block in ONE forward pass. Terms used across the package, the CUDA plugin
and the Triton configs:

- ``target_layer_ids``: decoder layers of the target whose post-layer residual stream is tapped
  (HF ``hidden_states[id + 1]``); concatenated in ascending order they are ``target_hidden``
  ``[T, n * H]``.
- ``target_hidden``: the tapped features of committed tokens. The drafter maps them through
  ``fc`` + ``hidden_norm`` to context features and appends them, as K/V, to its context cache.
- ``block_size``: tokens per draft block, written B. A block is ``[bonus token, MASK x K]`` with
  ``K = block_size - 1`` drafted slots.
- ``mask_token_id``: the id whose target embedding fills the K drafted slots.
- ``noise_embedding``: the target's ``embed_tokens`` applied to the block.
- ``bonus token``: the last committed token, sampled by the target but not yet run through it;
  it opens the next block (slot 0) and is verified as the first input of the next verify pass.
- ``acceptance_length``: committed tokens per verify step, ``a + 1`` where ``a`` counts the
  leading drafts equal to the target's own tokens. The paper's mean acceptance length is τ.

Lossless contract (sampling.py): the token at absolute position p of a request with seed s is a
pure function of (logits_p, s, p). Speculative decoding commits only target-chosen tokens, so it
emits exactly what autoregressive decoding emits, greedy or sampled, whatever else is batched.

The modules: sampling.py (the rule), verify.py (the target's tokens for a block and the acceptance
count), drafts.py (proposals: greedy, coupled, the confidence cut), reference.py (the paper's loop,
pure torch: the oracle the engine is tested against), autoregressive.py (the AR baseline), and the
request plumbing (requests.py, stops.py, bad_words.py, batch.py, stats.py). Nothing here depends on a
backend or a device; the engine that serves requests is runtime/.
"""
