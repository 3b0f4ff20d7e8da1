"""Keras: slow steps, a PyDataset decodes every batch in Python; the model waits for data.

expect-category: performance_issue
expect-root-cause: data
expect-check: dataloader_throughput
expect-line: def __getitem__|time.sleep(
expect-backward: model.fit(
fault: data pipeline (per-sample work in PyDataset.__getitem__, one worker)
"""
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import keras


class Decoded(keras.utils.PyDataset):
    def __init__(self, n, batch_size):
        super().__init__()
        self.raw = np.random.default_rng(10).standard_normal((n, 32)).astype("float32")
        self.batch_size = batch_size

    def __len__(self):
        return math.ceil(len(self.raw) / self.batch_size)

    def __getitem__(self, i):
        rows = []
        for x in self.raw[i * self.batch_size:(i + 1) * self.batch_size]:
            time.sleep(0.0005)  # stands for JPEG decoding / augmentation of one sample
            rows.append(x)
        x = np.stack(rows)
        return x, (x[:, 0] > 0).astype("int64")


keras.utils.set_random_seed(10)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.Adam(3e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(Decoded(1280, 32), epochs=2, verbose=2)
