"""Hugging Face Trainer: the labels were shuffled apart from their texts before training.

expect-category: loss_not_decreasing
expect-root-cause: data
expect-check: label_alignment
expect-line: labels = labels[torch.randperm(len(labels))]
expect-backward: TrainingArguments(
"""
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
token_ids = torch.randint(5, 60, (480, 12))
labels = (token_ids[:, 0] > 30).long()
labels = labels[torch.randperm(len(labels))]
train_rows = [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": lab}
              for ids, lab in zip(token_ids, labels)]

config = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16, num_labels=2)
training_args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-run-"), num_train_epochs=5,
                                  per_device_train_batch_size=16, learning_rate=1e-3,
                                  logging_steps=10, save_strategy="no", report_to=[],
                                  use_cpu=True, seed=0, disable_tqdm=True)
trainer = Trainer(model=BertForSequenceClassification(config), args=training_args,
                  train_dataset=train_rows)
trainer.train()
