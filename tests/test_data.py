"""Data: byte tokenizer round trip, deterministic global batches, dp shards that tile them exactly."""
import pytest
import torch

import minimega as mm
from minimega import data


def test_tokenizer_round_trip_and_corpus():
    text = "ZeRO shards optimizer states.\n"
    assert data.decode(data.encode(text)) == text
    tokens = data.corpus_tokens()
    assert len(tokens) > 30_000 and int(tokens.max()) < 256
    assert len(data.split_tokens("train")) + len(data.split_tokens("val")) == len(tokens)


def test_batches_are_deterministic_and_shifted():
    (x1, y1), (x2, y2) = data.global_batch(3, 4, 16), data.global_batch(3, 4, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(data.global_batch(4, 4, 16)[0], x1)
    assert int(data.global_batch(0, 4, 16, vocab_size=251)[0].max()) < 251


def test_dp_shards_tile_the_global_batch():
    x, y = data.global_batch(0, 8, 16)
    parts = [data.shard_rows((x, y), r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    with pytest.raises(ValueError, match="global batch size 8 is not divisible by dp=3"):
        data.shard_rows((x, y), 0, 3)
    mesh = mm.init_mesh()
    (bx, by), = list(data.batches(mesh, 1, 8, 16))
    assert torch.equal(bx, x) and torch.equal(by, y)
