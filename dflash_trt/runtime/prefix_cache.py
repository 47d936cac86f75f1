"""The prefix cache's index: content-addressed blocks of committed tokens, least recently used first out.

A block is `BLOCK` consecutive committed tokens at positions [i * BLOCK, (i + 1) * BLOCK) of a sequence; its
key is its tokens together with its parent block's key (vLLM and TensorRT-LLM chain block hashes the same
way), so equal keys mean equal prefixes. Each cached block has one id in the runners' block pools, which
hold the target's K/V AND the drafter's context K/V of those positions (backends' `save_prefix` /
`load_prefix`): a request that finds its prompt's first blocks here restores both and prefills only the
rest, so the drafter reads the same context it would have computed (acceptance warm = cold).

Only committed tokens are ever inserted (a sequence's tokens before its bonus token, whose K/V are final);
shared blocks are never written (a hit copies blocks into the request's own slot). Eviction is LRU under a
budget of blocks; a match touches its blocks leaf first, so parents stay more recent than their children
and are evicted after them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

BLOCK = 16  # tokens per block (vLLM's default block size)


@dataclass
class PrefixStats:
    """Counters since start (Prometheus names: vLLM's prefix_cache_queries / prefix_cache_hits are tokens)."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens restored from the cache
    inserted: int = 0  # blocks written
    evictions: int = 0  # blocks evicted


class PrefixCache:
    def __init__(self, n_blocks: int):
        if n_blocks < 1:
            raise ValueError(f"a prefix cache needs at least one block, got {n_blocks}")
        self.n_blocks = n_blocks
        self.entries: OrderedDict[tuple, tuple[int, tuple[int, ...]]] = OrderedDict()  # key -> (block id, tokens)
        self.free = list(range(n_blocks))
        self.stats = PrefixStats()

    @property
    def used(self) -> int:
        return len(self.entries)

    @staticmethod
    def _key(parent: tuple | None, tokens: tuple[int, ...]) -> tuple:
        return (hash(parent), hash(tokens))

    def _chain(self, tokens, n_blocks: int):
        parent = None
        for i in range(n_blocks):
            block = tuple(tokens[i * BLOCK : (i + 1) * BLOCK])
            key = self._key(parent, block)
            yield i, key, block
            parent = key

    def match(self, tokens, limit: int) -> list[int]:
        """Pool ids of the longest chain of cached blocks that starts `tokens` and covers at most `limit` tokens
        (a request keeps at least its last prompt token to prefill: its logits choose the first new token)."""
        ids, keys = [], []
        for _, key, block in self._chain(tokens, limit // BLOCK):
            entry = self.entries.get(key)
            if entry is None or entry[1] != block:  # the tokens too: a hash collision must not restore a stranger
                break
            ids.append(entry[0])
            keys.append(key)
        for key in reversed(keys):  # leaf first: parents end up the most recent
            self.entries.move_to_end(key)
        self.stats.queries += limit
        self.stats.hits += len(ids) * BLOCK
        return ids

    def insert(self, tokens, n_tokens: int) -> list[tuple[int, int]]:
        """Cache the full blocks of `tokens[:n_tokens]` (committed tokens): [(block index, pool id)] of the blocks
        the caller must now write into the pools (those not cached yet); evicts the least recently used."""
        new, keys = [], []
        for i, key, block in self._chain(tokens, n_tokens // BLOCK):
            keys.append(key)
            if key in self.entries:
                self.entries.move_to_end(key)  # this chain's blocks are not the ones to evict for its children
                continue
            if not self.free:
                oldest = next(iter(self.entries), None)
                if oldest is None or oldest in keys:  # the budget holds no more of this chain
                    keys.pop()
                    break
                self.free.append(self.entries.pop(oldest)[0])
                self.stats.evictions += 1
            block_id = self.free.pop()
            self.entries[key] = (block_id, block)
            new.append((i, block_id))
        for key in reversed(keys):
            if key in self.entries:
                self.entries.move_to_end(key)
        self.stats.inserted += len(new)
        return new
