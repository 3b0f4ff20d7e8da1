"""``padding_mask`` on real captures: a key-padding mask that marks the tokens, not the padding.

A small ``nn.TransformerEncoder`` decides which of two marker tokens is more frequent in
sequences padded on the right. The faulty model passes ``tokens != PAD`` as
``src_key_padding_mask`` (True = ignore: every real token hidden); the twin passes
``tokens == PAD``. The finding must be confirmed on the first by the copy given the inverted
mask, located where the mask is made, and left unconfirmed on the twin.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import model_debugger
from model_debugger import probing
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
PAD, A, B, VOCAB, LENGTH = 0, 1, 2, 8, 12


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def sequences(n: int, gen: torch.Generator):
    tokens = torch.randint(3, VOCAB, (n, LENGTH), generator=gen)
    marks = torch.rand(n, LENGTH, generator=gen) < 0.5
    which = torch.where(torch.rand(n, LENGTH, generator=gen) < 0.5, A, B)
    tokens[marks] = which[marks]
    lengths = torch.randint(4, LENGTH + 1, (n,), generator=gen)
    tokens[torch.arange(LENGTH)[None, :] >= lengths[:, None]] = PAD
    labels = ((tokens == A).sum(1) > (tokens == B).sum(1)).long()
    return tokens, labels


class Counter(nn.Module):
    def __init__(self, inverted: bool):
        super().__init__()
        self.inverted = inverted
        self.embed = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens):
        ignore = tokens != PAD if self.inverted else tokens == PAD  # <mask>
        h = self.encoder(self.embed(tokens), src_key_padding_mask=ignore)
        keep = (~ignore).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def train(inverted: bool):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = sequences(1024, gen)
    model = Counter(inverted)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _epoch in range(3):
        for i in range(0, 1024, 32):
            opt.zero_grad()
            F.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            opt.step()


@pytest.mark.parametrize("inverted", [True, False])
def test_a_padding_mask_that_hides_the_tokens_is_found(tmp_path, inverted):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train(inverted)
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 120.0)
    [f] = run_probes(ctx, ["padding_mask"]).findings
    assert f.root_cause == "architecture", f
    as_built, inverted_mask = (float(f.evidence[k]) for k in ("heldout_as_built",
                                                               "heldout_inverted"))
    if not inverted:  # ("inf" is how a record keeps a copy that went non-finite)
        assert not f.confirmed and inverted_mask > as_built
        return
    assert f.confirmed
    assert inverted_mask < 0.8 * as_built
    assert f.location["line"] == line_of("mask"), f.location
