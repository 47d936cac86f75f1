"""The static per-slot KV cache: named length API, writes by (slot, position), gathered reads."""

import torch

from dflash_trt.model.kv_cache import KVCache


def _cache():
    return KVCache(n_layers=2, n_slots=3, capacity=16, n_kv_heads=2, head_dim=4)


def test_crop_restores_cache_position():
    cache, slots = _cache(), torch.tensor([0, 2])
    cache.advance(slots, 9)
    cache.crop(slots[:1], 4)
    assert cache.get_pos(torch.arange(3)).tolist() == [4, 0, 9]
    cache.crop(slots, torch.tensor([1, 2]))
    assert cache.get_pos(slots).tolist() == [1, 2]
    cache.reset()
    assert cache.lengths.tolist() == [0, 0, 0]


def test_write_then_read_by_slot_and_position():
    cache = _cache()
    k = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).view(2, 3, 2, 4)
    slots, positions = torch.tensor([2, 0]), torch.tensor([[0, 1, 2], [5, 6, 7]])
    cache.write(1, slots, positions, k, -k)
    keys, values = cache.read(1, torch.tensor([2, 0]), 8)  # gathered (non-contiguous) slots
    assert keys.shape == (2, 2, 8, 4)
    assert torch.equal(keys[0, :, :3], k[0].transpose(0, 1))
    assert torch.equal(values[1, :, 5:8], -k[1].transpose(0, 1))
    assert keys[0, :, 3:].abs().sum() == 0
    contiguous, _ = cache.read(1, torch.tensor([0, 1]), 8)
    assert torch.equal(contiguous[0], keys[1])


def test_ragged_write_skips_invalid_entries():
    cache = _cache()
    k = torch.ones(2, 3, 2, 4)
    valid = torch.tensor([[True, True, False], [True, False, False]])
    cache.write(0, torch.tensor([0, 1]), torch.tensor([[0, 1, 2], [0, 1, 2]]), k, k, valid)
    assert cache.k[0, 0, 0, :, 0].tolist()[:3] == [1, 1, 0]
    assert cache.k[0, 1, 0, :, 0].tolist()[:3] == [1, 0, 0]


def test_write_past_capacity_is_an_error():
    cache = _cache()
    try:
        cache.write(0, torch.tensor([0]), torch.tensor([[16]]), torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4))
    except IndexError as exc:
        assert "capacity 16" in str(exc)
    else:
        raise AssertionError("expected IndexError")
