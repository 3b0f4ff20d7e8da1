"""Static lint of Keras training code: every rule fires on its pattern and stays silent on fixes.

Sources are plain strings (neither tensorflow nor keras is imported). In a firing case the
expected line is marked with ``# <-`` and the hit must point exactly there.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from model_debugger.pitfalls import torch_lint
from model_debugger.pitfalls.detect import framework_of_source
from model_debugger.pitfalls.keras_lint import LintHit, lint_file, lint_source
from model_debugger.records import ROOT_CAUSES

HEAD = """\
import numpy as np
import keras
from keras import layers
"""


def _src(body: str) -> str:
    return HEAD + textwrap.dedent(body)


def _marked(src: str) -> list[int]:
    return [i for i, line in enumerate(src.splitlines(), 1) if line.rstrip().endswith("# <-")]


def _hits(body: str, rule: str | None = None) -> tuple[list[LintHit], str]:
    src = _src(body)
    hits = lint_source(src, "train.py")
    return [h for h in hits if rule is None or h.rule == rule], src


def assert_fires(body: str, rule: str, root_cause: str) -> LintHit:
    hits, src = _hits(body, rule)
    lines = _marked(src)
    assert len(lines) == 1, "test source must mark exactly one line"
    assert [(h.rule, h.root_cause, h.line) for h in hits] == [(rule, root_cause, lines[0])]
    assert hits[0].file == "train.py" and hits[0].root_cause in ROOT_CAUSES
    assert len(hits[0].message) > 60
    return hits[0]


def assert_silent(body: str, rule: str | None = None) -> None:
    hits, _ = _hits(body, rule)
    assert hits == []


# --- loss_output_mismatch ---------------------------------------------------------------------

def test_softmax_with_from_logits_fires_at_the_activation():
    hit = assert_fires("""
model = keras.Sequential([
    layers.Dense(64, activation="relu"),
    layers.Dense(10, activation="softmax"),  # <-
    layers.Dropout(0.2),
])
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
""", "loss_output_mismatch", "architecture")
    assert "softmax" in hit.message and "from_logits" in hit.message


def test_final_softmax_layer_added_and_positional_from_logits():
    assert_fires("""
model = keras.models.Sequential()
model.add(layers.Dense(10))
model.add(layers.Activation("softmax"))  # <-
loss_fn = keras.losses.CategoricalCrossentropy(True)
model.compile("adam", loss_fn)
""", "loss_output_mismatch", "architecture")


def test_sigmoid_with_binary_from_logits_in_functional_model():
    hit = assert_fires("""
inputs = keras.Input(shape=(20,))
h = layers.Dense(16, activation="relu")(inputs)
outputs = layers.Dense(1, activation=keras.activations.sigmoid)(h)  # <-
model = keras.Model(inputs=inputs, outputs=outputs)
model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
""", "loss_output_mismatch", "architecture")
    assert "sigmoid" in hit.message


def test_subclassed_model_returning_softmax_with_from_logits():
    assert_fires("""
import tensorflow as tf

class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = layers.Dense(32, activation="relu")
        self.head = layers.Dense(5)

    def call(self, x):
        x = self.hidden(x)
        return tf.nn.softmax(self.head(x))  # <-

net = Net()
net.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
""", "loss_output_mismatch", "architecture")


def test_custom_loop_loss_object_with_from_logits():
    assert_fires("""
import tensorflow as tf
model = keras.Sequential([layers.Dense(10, activation="softmax")])  # <-
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.Adam()
for x, y in ds:
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables))
""", "loss_output_mismatch", "architecture")


def test_raw_scores_with_probability_loss_fire_at_the_compile_argument():
    hit = assert_fires("""
def build():
    model = keras.Sequential([layers.Dense(64, activation="relu"), layers.Dense(10)])
    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",  # <-
        metrics=["accuracy"],
    )
    return model

model = build()
""", "loss_output_mismatch", "architecture")
    assert "raw scores" in hit.message


def test_raw_scores_with_default_binary_crossentropy_class():
    assert_fires("""
inp = keras.Input((8,))
out = layers.Dense(1)(layers.Dense(4, activation="relu")(inp))
model = keras.Model(inp, out)
model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy())  # <-
""", "loss_output_mismatch", "architecture")


def test_single_unit_softmax_fires_at_the_activation():
    hit = assert_fires("""
model = keras.Sequential([layers.Dense(8, activation="relu"),
                          layers.Dense(1, activation="softmax")])  # <-
model.compile(optimizer="adam", loss="binary_crossentropy")
""", "loss_output_mismatch", "architecture")
    assert "1.0" in hit.message


@pytest.mark.parametrize("head, loss", [
    ('layers.Dense(10, activation="softmax")', '"sparse_categorical_crossentropy"'),
    ("layers.Dense(10)", "keras.losses.SparseCategoricalCrossentropy(from_logits=True)"),
    ('layers.Dense(1, activation="sigmoid")', '"binary_crossentropy"'),
    ('layers.Dense(1, activation="sigmoid")', "keras.losses.BinaryCrossentropy()"),
    ("layers.Dense(1)", "keras.losses.BinaryCrossentropy(from_logits=True)"),
    ("layers.Dense(1)", '"mse"'),
    ("layers.Dense(10)", "keras.losses.CategoricalCrossentropy(from_logits=use_logits)"),
    ("MyHead(10)", "keras.losses.CategoricalCrossentropy(from_logits=True)"),
])
def test_loss_output_mismatch_silent_when_output_and_loss_agree(head, loss):
    assert_silent(f"""
model = keras.Sequential([layers.Dense(32, activation="relu"), {head}])
model.compile(optimizer="adam", loss={loss})
""", "loss_output_mismatch")


def test_loss_output_mismatch_silent_when_the_loss_belongs_to_another_model():
    assert_silent("""
probs = keras.Sequential([layers.Dense(10, activation="softmax")])
logits = keras.Sequential([layers.Dense(10)])
probs.compile(loss="sparse_categorical_crossentropy")
logits.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
""", "loss_output_mismatch")


def test_from_logits_loop_silent_for_a_probability_wrapper_it_does_not_train():
    assert_silent("""
import tensorflow as tf
model = keras.Sequential([layers.Dense(32, activation="relu"), layers.Dense(10)])
probability_model = keras.Sequential([model, layers.Softmax()])
loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = loss_object(labels, predictions)
    return loss
""")


def test_raw_scores_silent_in_a_custom_loop_that_may_apply_softmax_itself():
    assert_silent("""
model = keras.Sequential([layers.Dense(10)])
loss_fn = keras.losses.CategoricalCrossentropy()
for x, y in ds:
    loss = loss_fn(y, keras.ops.softmax(model(x)))
""")


# --- label_format_mismatch --------------------------------------------------------------------

CLASSIFIER = """
model = keras.Sequential([layers.Dense(64, activation="relu"),
                          layers.Dense(10, activation="softmax")])
"""


def test_categorical_with_random_integer_labels():
    hit = assert_fires(CLASSIFIER + """
x = np.random.rand(1000, 20).astype("float32")
y = np.random.randint(0, 10, size=(1000,))
model.compile(optimizer="adam", loss="categorical_crossentropy")  # <-
model.fit(x, y, epochs=5)
""", "label_format_mismatch", "data")
    assert "randint" in hit.message


def test_categorical_class_with_dataset_labels_through_a_build_function():
    assert_fires("""
(x_train, y_train), _ = keras.datasets.mnist.load_data()
x_train = x_train.reshape(-1, 784) / 255.0

def make():
    m = keras.Sequential([layers.Dense(10, activation="softmax")])
    m.compile(optimizer="adam",
              loss=keras.losses.CategoricalCrossentropy())  # <-
    return m

model = make()
model.fit(x_train, y_train[:5000], batch_size=64)
""", "label_format_mismatch", "data")


@pytest.mark.parametrize("labels", [
    "scores.argmax(axis=1)", "np.argmax(scores, axis=1)", "(scores[:, 0] > 0).astype(int)",
])
def test_categorical_with_derived_integer_labels(labels):
    assert_fires(CLASSIFIER + f"""
scores = np.random.rand(100, 10)
labels = {labels}
model.compile("adam", keras.losses.categorical_crossentropy)  # <-
model.fit(x=np.random.rand(100, 20), y=labels)
""", "label_format_mismatch", "data")


def test_sparse_with_one_hot_labels():
    hit = assert_fires(CLASSIFIER + """
y = np.random.randint(0, 10, size=(100,))
y = keras.utils.to_categorical(y, 10)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")  # <-
model.fit(np.random.rand(100, 20), y)
""", "label_format_mismatch", "data")
    assert "one-hot" in hit.message


def test_sparse_with_one_hot_labels_inside_a_tf_dataset():
    assert_fires(CLASSIFIER + """
import tensorflow as tf
(x_train, y_train), _ = keras.datasets.mnist.load_data()
x_train = x_train.reshape(-1, 784) / 255.0
ds = tf.data.Dataset.from_tensor_slices((x_train, tf.one_hot(y_train, 10)))
ds = ds.shuffle(1000).batch(32)
model.compile(loss=keras.losses.SparseCategoricalCrossentropy())  # <-
model.fit(ds, epochs=2)
""", "label_format_mismatch", "data")


@pytest.mark.parametrize("labels, loss", [
    ("keras.utils.to_categorical(np.random.randint(0, 10, 100))", '"categorical_crossentropy"'),
    ("np.random.randint(0, 10, 100)", '"sparse_categorical_crossentropy"'),
    ("np.random.randint(0, 10, 100)", "keras.losses.SparseCategoricalCrossentropy()"),
    ("np.load('labels.npy')", '"categorical_crossentropy"'),
    ("np.random.randint(0, 2, size=(100, 10))", '"categorical_crossentropy"'),
    ("np.eye(10)[np.random.randint(0, 10, 100)]", '"categorical_crossentropy"'),
    ("np.random.randint(0, 10, 100)", '"mse"'),
])
def test_label_format_silent_when_labels_match_the_loss(labels, loss):
    assert_silent(CLASSIFIER + f"""
y = {labels}
model.compile(optimizer="adam", loss={loss})
model.fit(np.random.rand(100, 20), y)
""", "label_format_mismatch")


def test_label_and_input_rules_follow_a_dataset_module_alias():
    hits, _ = _hits(CLASSIFIER + """
import tensorflow as tf
cifar = tf.keras.datasets.cifar10
(x_train, y_train), (x_test, y_test) = cifar.load_data()
model.compile(optimizer="adam", loss="categorical_crossentropy")
model.fit(x_train, y_train)
""")
    assert [(h.rule, h.line) for h in hits] == [
        ("label_format_mismatch", 11), ("missing_input_normalization", 12)]


def test_silent_templates_fire_without_the_fix():
    """Controls: the templates of the silent cases above do fire on the buggy variant."""
    assert _hits("""
model = keras.Sequential([layers.Dense(32, activation="relu"), layers.Dense(10)])
model.compile(optimizer="adam", loss="categorical_crossentropy")
""", "loss_output_mismatch")[0]
    assert _hits(CLASSIFIER + """
y = np.random.randint(0, 10, 100)
model.compile(optimizer="adam", loss="categorical_crossentropy")
model.fit(np.random.rand(100, 20), y)
""", "label_format_mismatch")[0]
    assert _hits(CLASSIFIER + """
(x_train, y_train), _ = keras.datasets.cifar10.load_data()
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x_train, y_train)
""", "missing_input_normalization")[0]


def test_categorical_silent_when_labels_are_one_hot_encoded_in_place():
    assert_silent(CLASSIFIER + """
(x_train, y_train), _ = keras.datasets.cifar10.load_data()
x_train = x_train / 255.0
y_train = keras.utils.to_categorical(y_train, 10)
model.compile(optimizer="adam", loss="categorical_crossentropy")
model.fit(x_train, y_train)
""")


# --- missing_input_normalization --------------------------------------------------------------

def test_raw_mnist_pixels_fire_at_fit():
    hit = assert_fires(CLASSIFIER + """
(x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
x_train = x_train.reshape(-1, 784).astype("float32")
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x_train, y_train,  # <-
          validation_data=(x_test, y_test), epochs=3)
""", "missing_input_normalization", "data")
    assert "255" in hit.message and "mnist" in hit.message


@pytest.mark.parametrize("make", [
    "np.random.randint(0, 256, size=(64, 32, 32, 3))",
    "np.zeros((64, 32, 32, 3), dtype=np.uint8)",
    "np.stack([np.array(Image.open(p)) for p in paths])",
    "keras.utils.image_dataset_from_directory('data/train').prefetch(2)",
])
def test_image_like_inputs_fire_at_fit(make):
    assert_fires(CLASSIFIER + f"""
from PIL import Image
x = {make}
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x, np.zeros(64), epochs=1)  # <-
""", "missing_input_normalization", "data")


def test_image_data_generator_without_rescale_fires():
    assert_fires(CLASSIFIER + """
gen = keras.preprocessing.image.ImageDataGenerator(horizontal_flip=True)
train = gen.flow_from_directory("data/train", target_size=(64, 64))
model.compile(optimizer="adam", loss="categorical_crossentropy")
model.fit(train, epochs=3)  # <-
""", "missing_input_normalization", "data")


@pytest.mark.parametrize("prep", [
    "x_train = x_train / 255.0",
    "x_train = x_train.astype('float32')\nx_train /= 255",
    "x_train = (x_train - x_train.mean()) / x_train.std()",
    "model = keras.Sequential([layers.Rescaling(1 / 255), layers.Dense(10)])",
    "norm = layers.Normalization()\nnorm.adapt(x_train)",
    "x_train = keras.applications.resnet50.preprocess_input(x_train)",
    "x_train = np.load('features.npy')",
    "x_train, x_test = x_train / 255.0, None",
    "x_train = x_train.astype('float32')\nmodel.add(layers.BatchNormalization())",
])
def test_input_normalization_silent_when_inputs_are_scaled(prep):
    assert_silent(CLASSIFIER + f"""
(x_train, y_train), _ = keras.datasets.cifar10.load_data()
{prep}
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x_train, y_train)
""", "missing_input_normalization")


def test_input_normalization_silent_for_token_ids():
    assert_silent("""
x = np.random.randint(0, 256, size=(100, 40))
model = keras.Sequential([layers.Embedding(256, 16), layers.GlobalAveragePooling1D(),
                          layers.Dense(2, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x, np.zeros(100))
""")


def test_input_normalization_silent_for_non_keras_fit_and_mapped_datasets():
    assert_silent("""
import tensorflow as tf
from sklearn.decomposition import PCA
(x_train, y_train), _ = keras.datasets.mnist.load_data()
PCA(10).fit(x_train.reshape(-1, 784))
ds = keras.utils.image_dataset_from_directory("data").map(lambda a, b: (a / 255, b))
model = keras.Sequential([layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(ds)
""")


# --- API, detect, isolation -------------------------------------------------------------------

def test_lint_file_and_hit_type(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(_src("""
model = keras.Sequential([layers.Dense(3, activation="softmax")])
model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True))
"""))
    hits = lint_file(str(path), model_names=["model"])
    assert [(h.rule, h.line) for h in hits] == [("loss_output_mismatch", 5)]
    assert isinstance(hits[0], torch_lint.LintHit) and hits[0].file == str(path)


@pytest.mark.parametrize("source", ["def broken(:\n", "", "x = 1\n", "%matplotlib inline\n"])
def test_unparsable_or_irrelevant_sources_give_nothing(source):
    assert lint_source(source, "cell.py") == []


def test_no_rule_fires_on_eval_without_no_grad_patterns():
    assert_silent(CLASSIFIER + """
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
for x, y in ds:
    preds = model(x, training=False)
model.evaluate(np.random.rand(10, 20), np.zeros(10))
""")


@pytest.mark.parametrize("source, expected", [
    ("import torch\nfrom torch import nn\n", "torch"),
    ("from torch.utils.data import DataLoader\n", "torch"),
    ("import keras\nfrom keras import layers\n", "keras"),
    ("import tensorflow as tf\nmodel = tf.keras.Sequential()\n", "keras"),
    ("from tensorflow.keras import layers\n", "keras"),
    ("import tensorflow as tf\nimport torch\n", "torch"),
    ("import numpy as np\n# torch and keras only in a comment\nx = 'import torch'\n", "none"),
    ("from .torch import helper\n", "none"),
    ("%matplotlib inline\nimport keras\n", "keras"),
    ("!pip install torch\nimport torch.nn as nn\n", "torch"),
    ("", "none"),
])
def test_framework_of_source(source, expected):
    assert framework_of_source(source) == expected


def test_importing_the_lint_imports_no_framework():
    code = ("import sys\n"
            "import model_debugger.pitfalls.keras_lint as k, model_debugger.pitfalls.detect\n"
            "k.lint_source('import keras\\nmodel.compile(loss=\"mse\")\\n', 'x.py')\n"
            "bad = [m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules]\n"
            "print(','.join(bad))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


# --- one output unit: a separate Activation, a multi-class loss -------------------------------

@pytest.mark.parametrize("body", [
    """
model = keras.Sequential()
model.add(layers.Dense(8, activation="relu", input_dim=4))
model.add(layers.Dense(1))
model.add(layers.Dropout(0.1))
model.add(layers.Activation("softmax"))  # <-
model.compile(loss="binary_crossentropy", optimizer="adam")
model.fit(x, y)
""",
    """
inp = keras.Input((4,))
h = layers.Dense(8, activation="relu")(inp)
z = layers.Dense(1)(h)
out = layers.Activation("softmax")(z)  # <-
model = keras.Model(inp, out)
model.compile(loss="binary_crossentropy", optimizer="adam")
model.fit(x, y)
"""], ids=["sequential", "functional"])
def test_one_unit_followed_by_a_separate_softmax_fires_at_the_activation(body):
    hit = assert_fires(body, "loss_output_mismatch", "architecture")
    assert "single unit" in hit.message


def test_two_units_followed_by_a_separate_softmax_are_silent():
    assert_silent("""
model = keras.Sequential([layers.Dense(8, activation="relu"), layers.Dense(2),
                          layers.Activation("softmax")])
model.compile(loss="categorical_crossentropy", optimizer="adam")
model.fit(x, y)
""", "loss_output_mismatch")


def test_categorical_crossentropy_over_one_unit_fires_at_the_loss():
    hit = assert_fires("""
model = keras.Sequential()
model.add(layers.Dense(16, activation="relu", input_dim=4))
model.add(layers.Dense(1, activation="sigmoid"))
model.compile(loss="categorical_crossentropy",  # <-
              optimizer="adam", metrics=["accuracy"])
model.fit(x, y)
""", "loss_output_mismatch", "architecture")
    assert "single unit" in hit.message
    assert_silent("""
model = keras.Sequential([layers.Dense(16, activation="relu"), layers.Dense(1, activation="sigmoid")])
model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
model.fit(x, y)
""", "loss_output_mismatch")


@pytest.mark.parametrize("body, marked", [
    ("""
model = keras.Sequential([
    layers.Dense(8, activation="relu"),
    layers.Dense(1, activation="sigmoid"),  # <-
])
""", True),
    ("""
inp = keras.Input((3,))
out = layers.Dense(1, activation="relu", name="y")(layers.Dense(4)(inp))  # <-
m = keras.Model(inputs=inp, outputs=out)
""", True),
    ("""
def build(widths, activation="relu"):
    model = keras.Sequential()
    for units in widths:
        model.add(layers.Dense(units, activation=activation))
    model.add(layers.Dense(1, activation=activation))  # <-
    return model
""", True),
    ("x = 1\n", False)])
def test_output_layer_line_is_the_line_that_made_the_last_layer(body, marked):
    from model_debugger.pitfalls.keras_lint import output_layer_line

    src = _src(body)
    assert output_layer_line(src) == (_marked(src)[0] if marked else None)


def test_a_relu_output_under_a_probability_loss_fires_at_the_activation():
    """A ReLU's outputs are no distribution: Keras divides them by their sum (0/0 on a row of
    zeros: NaN) and clips; the hit is on the activation that made the output."""
    hit = assert_fires("""
model = keras.Sequential()
model.add(layers.Dense(64, input_dim=64, activation="relu"))
model.add(layers.Dense(10, activation="relu"))  # <-
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
model.fit(x, y)
""", "loss_output_mismatch", "architecture")
    assert 'activation="softmax"' in hit.message and "NaN" in hit.message


# --- early_stop_on_training -------------------------------------------------------------------

_FIT_WITH_STOP = """
model = keras.Sequential([keras.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
stop = keras.callbacks.EarlyStopping(monitor={monitor}, patience=3)  {mark}
model.fit(x, y, epochs=50, {validation}, callbacks=[stop])
"""


@pytest.mark.parametrize("validation", ["validation_split=0.2", "validation_data=(xv, yv)"])
def test_a_stopper_watching_the_training_loss_with_validation_data_fires(validation):
    hit = assert_fires(_FIT_WITH_STOP.format(monitor='"loss"', mark="# <-",
                                             validation=validation),
                       "early_stop_on_training", "training_loop")
    assert "val_loss" in hit.message


@pytest.mark.parametrize("monitor, validation", [('"val_loss"', "validation_split=0.2"),
                                                 ('"loss"', "verbose=0"),
                                                 ('"loss"', "validation_data=None")])
def test_a_stopper_on_validation_or_without_validation_data_is_silent(monitor, validation):
    assert_silent(_FIT_WITH_STOP.format(monitor=monitor, mark="", validation=validation),
                  "early_stop_on_training")


@pytest.mark.parametrize("primary, best, fires", [("overfitting", 4, True),
                                                  ("overfitting", 8, False),
                                                  ("healthy", 4, False)])
def test_a_stopper_on_training_is_confirmed_when_the_run_went_on_past_its_best(primary, best,
                                                                              fires):
    from types import SimpleNamespace

    from model_debugger.probes.lint import _measured

    ctx = SimpleNamespace(signals={"val_points": 10, "val_loss_min_index": best},
                          classification=SimpleNamespace(primary=primary))
    assert _measured(ctx, "early_stop_on_training") is fires
    assert _measured(ctx, "eval_without_no_grad") is False
