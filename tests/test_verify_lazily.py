"""The CPU backend's `verify_lazily` (lm_head in growing chunks, stopped once every row has a mismatch) returns
the tokens that matter and the acceptance counts of `verify_block` over the full logits."""

import pytest
import torch

from dflash_trt.backends.cpu.target import verify_lazily
from dflash_trt.decoding.verify import verify_block


def _case(seed: int, batch: int, width: int, temperature: float):
    g = torch.Generator().manual_seed(seed)
    hidden_size, vocab = 16, 64
    hidden = torch.randn(batch, width, hidden_size, generator=g)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden_size, generator=g))
        if seed % 5 == 0:  # a NaN row and a -inf column: the rule's edge cases go through chunks too
            head.weight[3, 0] = float("-inf")
    start = torch.randint(0, 100, (batch,), generator=g)
    sampling = (torch.full((batch,), temperature), torch.randint(0, 8, (batch,), generator=g),
                torch.rand(batch, generator=g).clamp(0.3, 1.0), torch.randint(0, 1000, (batch,), generator=g))
    with torch.no_grad():
        full_logits = head(hidden)
        if seed % 5 == 0:
            full_logits[0, width // 2] = float("nan")
    truth, _ = verify_block(full_logits, torch.zeros(batch, width - 1, dtype=torch.int64), start, *sampling)
    # drafts follow the target's own tokens for a random prefix per row, then diverge
    keep = torch.randint(0, width, (batch,), generator=g)
    drafts = truth[:, : width - 1].clone()
    for row in range(batch):
        if keep[row] < width - 1:
            drafts[row, keep[row]] = (drafts[row, keep[row]] + 1) % vocab
    return hidden, head, drafts, start, sampling, full_logits


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lazy_verify_equals_full_verify(temperature):
    for seed in range(60):
        batch, width = 1 + seed % 4, 2 + (seed * 7) % 15
        hidden, head, drafts, start, sampling, full_logits = _case(seed, batch, width, temperature)
        if seed % 5 == 0:  # make the NaN row reachable: recompute logits through the same head
            hidden[0, width // 2] = float("nan")
            full_logits = head(hidden).detach()
        expected_tokens, expected_accepted = verify_block(full_logits, drafts, start, *sampling)
        with torch.no_grad():
            tokens, accepted = verify_lazily(hidden, head, drafts, start, sampling, verify_block, twin=False)
        assert torch.equal(accepted, expected_accepted), (seed, accepted, expected_accepted)
        for row in range(batch):
            a = int(accepted[row])
            assert torch.equal(tokens[row, : a + 1], expected_tokens[row, : a + 1]), (seed, row)


def test_lazy_verify_stops_early_when_every_row_mismatches():
    calls = []
    hidden, head, drafts, start, sampling, full_logits = _case(1, 2, 16, 0.0)
    truth, _ = verify_block(full_logits, drafts, start, *sampling)
    drafts = truth[:, :15].clone()
    drafts[:, 1] = (drafts[:, 1] + 1) % 64  # both rows reject their second draft

    def counting_head(x):
        calls.append(x.shape[0])
        return head(x)

    with torch.no_grad():
        tokens, accepted = verify_lazily(hidden, counting_head, drafts, start, sampling, verify_block, twin=False)
    assert accepted.tolist() == [1, 1] and calls == [2 * 4]  # one chunk of 4 rows per batch row
    assert (tokens[:, 4:] == -1).all()
