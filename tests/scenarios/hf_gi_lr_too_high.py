"""Hugging Face Trainer: a tiny BERT fine-tuned with a learning rate of 5 (meant: 5e-5).

expect-category: gradient_instability
expect-root-cause: hyperparameter
expect-check: lr_range|overfit_small_batch|dead_units|gradient_flow
expect-line: TrainingArguments(|learning_rate=5.0
expect-backward: TrainingArguments(
"""
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)


class Reviews(Dataset):
    def __init__(self, n, seed, vocab=60, length=12):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 0] > vocab // 2).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.labels[i]}


config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-run-"), num_train_epochs=4, per_device_train_batch_size=16,
                         learning_rate=5.0, logging_steps=10, save_strategy="no",
                         report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Reviews(320, 1)).train()
