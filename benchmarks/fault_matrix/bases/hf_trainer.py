"""A tiny BERT built from a config, fine-tuned with the Hugging Face Trainer on token rules."""
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

VOCAB, LENGTH = 64, 12


def token_rule(n, seed):
    """Label 1 when the first token is in the upper half of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (n, LENGTH), generator=g)
    return ids, (ids[:, 0] >= VOCAB // 2).long()


class TokenRows(Dataset):
    def __init__(self, ids, labels):
        self.ids, self.labels = ids, labels

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


train_ids, train_labels = token_rule(480, 1)
eval_ids, eval_labels = token_rule(160, 2)
config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, max_position_embeddings=LENGTH,
                    num_labels=2)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir=tempfile.mkdtemp(), num_train_epochs=4,
                         per_device_train_batch_size=16, learning_rate=1e-3, warmup_steps=10,
                         logging_steps=20, eval_strategy="epoch", save_strategy="no",
                         report_to=[], use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=TokenRows(train_ids, train_labels),
                  eval_dataset=TokenRows(eval_ids, eval_labels))
trainer.train()
print(trainer.evaluate())
