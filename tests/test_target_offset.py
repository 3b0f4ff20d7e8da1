"""``target_offset`` on real captures: token targets paired with the wrong input position.

A Hugging Face causal LM given labels the loop already shifted (it shifts them again: the
token after next), a GRU language model whose targets are its inputs (the token it is given),
and the same GRU trained on the next token (right: no finding).
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
VOCAB = 12


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def markov(n: int, length: int = 17) -> torch.Tensor:
    """Token rows of a chain that mostly steps to the next id."""
    g = torch.Generator().manual_seed(0)
    rows = torch.zeros(n, length, dtype=torch.long)
    rows[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for t in range(1, length):
        jump = torch.rand(n, generator=g) < 0.1
        rows[:, t] = torch.where(jump, torch.randint(0, VOCAB, (n,), generator=g),
                                 (rows[:, t - 1] + 1) % VOCAB)
    return rows


def train_hf_shifted_twice():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=1,
                                    n_head=2))
    opt = torch.optim.Adam(lm.parameters(), lr=3e-3)
    data = markov(128)
    for i in range(0, 128, 16):
        ids, labels = data[i:i + 16, :-1], data[i:i + 16, 1:]  # <hf-shifted>
        out = lm(input_ids=ids, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()


class TinyLM(nn.Module):
    def __init__(self, both_ways: bool = False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.rnn = nn.GRU(16, 32, batch_first=True, bidirectional=both_ways)
        self.head = nn.Linear(64 if both_ways else 32, VOCAB)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


def train_gru(shift: int, both_ways: bool = False):
    torch.manual_seed(0)
    lm = TinyLM(both_ways)
    opt = torch.optim.Adam(lm.parameters(), lr=3e-3)
    data = markov(128)
    for i in range(0, 128, 16):
        ids = data[i:i + 16, :-1]
        targets = data[i:i + 16, shift:shift + ids.shape[1]]  # <gru-targets>
        loss = F.cross_entropy(lm(ids).reshape(-1, VOCAB), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


def _findings(tmp_path, train, *args):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train(*args)
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    return run, run_probes(ctx, ["target_offset"]).findings


def test_labels_shifted_before_a_causal_lm_shifts_them_again_are_found(tmp_path):
    pytest.importorskip("transformers")
    run, findings = _findings(tmp_path, train_hf_shifted_twice)
    assert run.first("target_offset")["matches"]["2"] == 1.0
    [f] = findings
    assert (f.root_cause, f.confirmed, f.evidence["offset"], f.evidence["causal"]) == \
        ("training_loop", True, 2, True)
    assert f.location["line"] == line_of("hf-shifted"), f.location


@pytest.mark.parametrize("shift,found", [(0, True), (1, False)])
def test_targets_that_are_the_inputs_are_found_and_next_tokens_are_not(tmp_path, shift, found):
    run, findings = _findings(tmp_path, train_gru, shift)
    assert run.first("target_offset")["matches"][str(shift)] == 1.0
    if not found:
        assert findings == ()
        return
    [f] = findings
    assert (f.confirmed, f.evidence["offset"]) == (True, 0)
    assert f.location["line"] == line_of("gru-targets"), f.location


def test_a_model_reading_the_whole_sequence_may_pair_a_position_with_itself(tmp_path):
    """A bidirectional tagger (or an autoencoder) whose targets are its inputs: not a causal
    model, so the same position is no copy of the future; nothing is reported."""
    run, findings = _findings(tmp_path, train_gru, 0, True)
    assert run.first("target_offset")["matches"]["0"] == 1.0
    assert findings == ()
