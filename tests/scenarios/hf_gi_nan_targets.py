"""Hugging Face Trainer: a regression head trained on scores where missing ones are NaN.

expect-category: gradient_instability
expect-root-cause: data
expect-check: nonfinite_inputs
expect-line: scores[::37] = float("nan")
expect-backward: TrainingArguments(
"""
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
token_ids = torch.randint(5, 60, (400, 12))
scores = token_ids[:, :4].float().mean(1) / 60
scores[::37] = float("nan")
rows = [{"input_ids": ids, "labels": s} for ids, s in zip(token_ids, scores)]

config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=1)
args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-run-"), num_train_epochs=3, per_device_train_batch_size=16,
                         learning_rate=1e-3, logging_steps=10, save_strategy="no", report_to=[],
                         use_cpu=True, seed=0, disable_tqdm=True, logging_nan_inf_filter=True)
Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=rows).train()
