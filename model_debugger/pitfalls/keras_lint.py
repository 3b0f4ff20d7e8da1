"""Static lint of Keras 3 / tf.keras training code: loss/output, label and input-scale pitfalls.

Pure ``ast``; neither tensorflow nor keras is imported. Each hit names a probe id and a root-cause
kind (DESIGN.md) and the exact line to look at. Rules:

- ``loss_output_mismatch`` (``architecture``): a final softmax/sigmoid fed to a crossentropy built
  with ``from_logits=True``, in ``compile`` or, when nothing is compiled, applied to the model's
  output in a custom loop (line: the activation); a last ``Dense`` without activation fed to a
  crossentropy that expects probabilities (line: the ``compile`` loss argument); a softmax over a
  single unit, whose output is always 1 (line: the activation).
- ``label_format_mismatch`` (``data``): ``categorical_crossentropy`` with integer class ids and no
  one-hot encoding anywhere, or ``sparse_categorical_crossentropy`` with one-hot labels (line: the
  ``compile`` loss argument).
- ``missing_input_normalization`` (``data``): image-like 0-255 data reaches ``fit()`` with no
  division, no ``Rescaling``/``Normalization`` layer and no ``preprocess_input`` (line: ``fit``).
- ``early_stop_on_training`` (``training_loop``): an ``EarlyStopping``, ``ModelCheckpoint`` or
  ``ReduceLROnPlateau`` watching a training quantity (``monitor="loss"``) while ``fit`` has
  validation data (line: the callback).

Models are followed through ``Sequential([...])`` / ``.add()``, the functional ``Model(inputs,
outputs)``, ``keras.Model`` subclasses (their ``call``) and functions that build and return them;
data through bindings and shape-only operations (see :mod:`._keras_ast`). When a fact cannot be
established from the source, the rule stays silent. The shared type is
:class:`~model_debugger.pitfalls.torch_lint.LintHit`.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from ._keras_ast import LOSS_FAMILY, Index, const_str, dotted, kwarg, loss_info, pos, tail
from .torch_lint import LintHit

__all__ = ["RULES", "LintHit", "lint_file", "lint_source"]

# every rule this pack reports (``LintHit.rule``), as in :data:`.torch_lint.RULES`
RULES = ("loss_output_mismatch", "label_format_mismatch", "missing_input_normalization",
         "early_stop_on_training")

_ONEHOT = {"to_categorical", "one_hot", "label_binarize", "get_dummies"}
_INT_MAKERS = {"randint", "integers", "argmax"}
_IMAGE_SETS = {"mnist", "fashion_mnist", "cifar10", "cifar100"}
_LABEL_SETS = _IMAGE_SETS | {"imdb", "reuters"}
_IMAGE_LOADERS = {"imread", "decode_jpeg", "decode_png", "decode_image", "decode_bmp",
                  "decode_gif", "img_to_array", "image_dataset_from_directory"}
# any of these anywhere in the source counts as input scaling (conservative)
_SCALERS = {"Rescaling", "Normalization", "BatchNormalization", "LayerNormalization", "Lambda",
            "preprocess_input", "per_image_standardization"}
# integer inputs that are indices, not intensities: never rescale these
_TOKEN_LAYERS = {"Embedding", "TextVectorization", "StringLookup", "IntegerLookup",
                 "CategoryEncoding", "Hashing"}
_GEN_SCALING = {"rescale", "preprocessing_function", "featurewise_center", "samplewise_center",
                "featurewise_std_normalization", "samplewise_std_normalization"}
_FAMILY_TEXT = {"categorical": "categorical crossentropy", "sparse": "sparse categorical "
                "crossentropy", "binary": "binary crossentropy"}


def lint_source(source: str, filename: str, model_names: Sequence[str] = ()) -> list[LintHit]:
    """Lint Keras / tf.keras training code.

    Parameters
    ----------
    source : str
        Python source (a script or the cells of a notebook joined together).
    filename : str
        Reported as ``LintHit.file``.
    model_names : sequence of str
        Accepted for symmetry with :func:`model_debugger.pitfalls.torch_lint.lint_source`;
        Keras models are recognised from their constructors, so the names are not needed.

    Returns
    -------
    list of LintHit
        Sorted by line, one per (rule, line); empty when the source does not parse.
    """
    del model_names  # models are found from Sequential / Model / subclass constructors
    if not any(w in source for w in ("compile", "fit", "oftmax", "igmoid", "train_on_batch")):
        return []  # no rule can fire
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError):
        return []
    try:
        raw = _analyse(Index(tree))
    except RecursionError:  # pathologically nested expressions: no verdict rather than a crash
        return []
    seen: dict[tuple, LintHit] = {}
    for rule, root, line, message in sorted(raw, key=lambda h: (h[2], h[0])):
        seen.setdefault((rule, line), LintHit(rule, root, filename, line, message))
    return list(seen.values())


def output_layer_line(source: str) -> int | None:
    """The line of the layer that decides the model's output (its activation), or None.

    Where a finding about the output's range or activation is located: the line that made the
    faulty layer, not the line that assembled the model. None when the source does not parse,
    holds no Keras model, or several models whose last layers differ.
    """
    try:
        idx = Index(ast.parse(source))
        models = [c for c in idx.calls if tail(c) == "Sequential"
                  or (tail(c) in ("Model", "Functional") and idx.outputs(c) is not None)]
        models += [cls for cls in idx.classes.values() if idx.is_model_class(cls)]
        lines = {layer.node.lineno for layer in map(idx.last_layer, models)
                 if layer is not None and getattr(layer.node, "lineno", None)}  # (its kind
        # may be unknown, an activation given through a parameter: the line is still known)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return lines.pop() if len(lines) == 1 else None


_FEEDS = ("fit", "evaluate", "compile", "train_on_batch", "test_on_batch", "predict")


def head_layer_line(source: str, head: str, index: int | None = None) -> int | None:
    """The line that made the output ``head`` of a multi-output model, or None.

    The layer built with ``name="<head>"``; else the value under the key ``"<head>"`` of an
    outputs dict (``keras.Model(x, {"stay": stay_out})``): that call, or the last assignment of
    that name before the dict (a dict given to ``Model`` first: the targets dict holds the same
    keys); else, for outputs given as a list, its element ``index``. None when the source does
    not parse or makes it in several places.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    named = {node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
             and any(k.arg == "name" and isinstance(k.value, ast.Constant)
                     and k.value.value == head for k in node.keywords)}
    if named:
        return named.pop() if len(named) == 1 else None
    fed = {id(a) for call in ast.walk(tree) if isinstance(call, ast.Call)
           and tail(call) in _FEEDS for a in (*call.args, *(k.value for k in call.keywords))}
    dicts = [node for node in ast.walk(tree) if isinstance(node, ast.Dict)
             and id(node) not in fed]  # (not the targets, losses or metrics given by name)
    given = [a for call in ast.walk(tree) if isinstance(call, ast.Call)  # models' outputs
             and tail(call) in ("Model", "Functional")
             for a in (*call.args[1:2], *(k.value for k in call.keywords if k.arg == "outputs"))]
    outputs = [a for a in given if isinstance(a, ast.Dict)]  # before any other dict
    made: set[int] = set()
    for node in outputs or dicts:
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value == head:
                made.add(_made_line(tree, value, node.lineno))
    if not outputs:  # outs["stay"] = Dense(1)(h): a dict of outputs filled by key
        made |= {node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Call) and any(
                     isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                     and t.slice.value == head for t in node.targets)}
    if not made and index is not None:
        made = {_made_line(tree, a.elts[index], a.lineno) for a in given
                if isinstance(a, (ast.List, ast.Tuple)) and len(a.elts) > index > -1}
    made.discard(None)
    return made.pop() if len(made) == 1 else None


def _made_line(tree: ast.AST, value: ast.AST, before: int) -> int | None:
    """The line of ``value`` when it is a call; of a name's last assignment before ``before``."""
    if isinstance(value, ast.Call):
        return value.lineno
    if not isinstance(value, ast.Name):
        return None
    lines = [a.lineno for a in ast.walk(tree) if isinstance(a, ast.Assign) and a.lineno < before
             and any(isinstance(t, ast.Name) and t.id == value.id for t in a.targets)]
    return max(lines) if lines else None


def lint_file(path: str, model_names: Sequence[str] = ()) -> list[LintHit]:
    """Read ``path`` and lint it (see :func:`lint_source`); a file that does not parse gives []."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return lint_source(fh.read(), str(path), model_names)


# --- models and their compile calls -----------------------------------------------------------

def _key(idx: Index, recv: ast.AST, at_call: ast.Call):
    model = idx.model_of(recv, idx.scope_of(at_call), pos(at_call))
    if model is not None:
        return id(model)
    name = dotted(recv)
    return ("name", name) if name else None


def _short(node: ast.AST, limit: int = 70) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _analyse(idx: Index) -> list[tuple]:
    compiles = []  # (call, model key, loss expression)
    for c in idx.calls:
        if tail(c) == "compile" and isinstance(c.func, ast.Attribute):
            loss = kwarg(c, "loss", 1)
            if loss is not None:
                compiles.append((c, _key(idx, c.func.value, c), loss))
    models = [c for c in idx.calls if tail(c) == "Sequential"
              or (tail(c) in ("Model", "Functional") and idx.outputs(c) is not None)]
    models += [cls for cls in idx.classes.values() if idx.is_model_class(cls)]
    raw: list[tuple] = []
    for model in models:
        mine = [(c, loss) for c, key, loss in compiles if key == id(model)
                or (len(models) == 1 and isinstance(key, tuple))]
        raw += _output_rules(idx, model, mine, not compiles)
    raw += _fit_rules(idx, compiles)
    return raw


def _loose_losses(idx: Index, model: ast.AST) -> list[tuple]:
    """Crossentropies with ``from_logits=True`` applied to this model's output (custom loops)."""
    out = []
    for c in idx.calls:
        if not LOSS_FAMILY.get((tail(c) or "").replace("_", "").lower()):
            continue
        info = loss_info(c, idx, idx.scope_of(c), pos(c))
        if not info or info[1] is not True:
            continue
        uses = [c] if tail(c)[0].islower() else [u for u in idx.calls if isinstance(u.func, ast.Name)
                                   and idx.value_of(u.func, idx.scope_of(u), pos(u))[0] is c]
        if any(_feeds(idx, use, model) for use in uses):
            out.append((info, c, None))
    return out


def _feeds(idx: Index, use: ast.Call, model: ast.AST) -> bool:
    """Whether an argument of the loss call ``use`` is the output of ``model``."""
    scope, at = idx.scope_of(use), pos(use)
    for arg in use.args:
        value, vat = idx.value_of(arg, scope, at)
        if isinstance(value, ast.Call) and idx.model_of(value.func, scope, vat) is model:
            return True
    return False


def _output_rules(idx: Index, model: ast.AST, mine: list, no_compile: bool) -> list[tuple]:
    layer = idx.last_layer(model)
    if layer is None or layer.kind == "unknown":
        return []
    out = []
    if layer.kind == "softmax" and layer.units == 1:
        out.append(("loss_output_mismatch", "architecture", layer.node.lineno, (
            "the last layer is a Dense with a single unit and a softmax: softmax normalises "
            "over the units, so one unit always outputs exactly 1.0 whatever the input; the "
            "gradient through it is zero, the loss never moves and accuracy stays at the class "
            "prior. For a binary target use activation=\"sigmoid\" with binary crossentropy, "
            "or 2 units with softmax.")))
    losses = [(loss_info(loss, idx, idx.scope_of(c), pos(c)), loss, c) for c, loss in mine]
    if no_compile:
        losses += _loose_losses(idx, model)
    for info, loss, comp in losses:
        if info is None:
            continue
        family, logits = info
        text = _short(loss)
        if family == "categorical" and layer.units == 1:
            out.append(("loss_output_mismatch", "architecture", loss.lineno, (
                f"the loss `{text}` compares a distribution over classes, but the last layer "
                f"(line {layer.node.lineno}) has a single unit: normalised over one unit the "
                "prediction is always 1.0, so the loss reads 0 (or one constant) whatever the "
                "model outputs, gives no useful gradient and accuracy stays at chance. For two "
                "classes use binary_crossentropy with one sigmoid unit, or one-hot targets "
                "with 2 softmax units.")))
            continue
        if layer.kind in ("softmax", "sigmoid") and logits is True:
            out.append(("loss_output_mismatch", "architecture", layer.node.lineno,
                        _squash_twice(layer.kind, text)))
        elif layer.kind == "other" and layer.dense and logits is False and comp is not None \
                and isinstance(layer.node, ast.Constant):
            squash = "sigmoid" if family == "binary" else "softmax"
            out.append(("loss_output_mismatch", "architecture", layer.node.lineno, (
                f"the last Dense layer has activation=\"{layer.node.value}\", which does not "
                f"give probabilities, but the loss `{text}` treats its outputs as probabilities "
                f"(from_logits is False): Keras clips them to [1e-7, 1-1e-7]"
                f"{' after dividing by their sum (a row of zeros, which a ReLU gives, divides 0 by 0: NaN)' if family != 'binary' else ''}"
                f", so the loss stalls, jumps or goes NaN. Use activation=\"{squash}\" on the "
                "last layer (or none, with from_logits=True).")))
        elif layer.kind == "linear" and layer.dense and logits is False and comp is not None:
            squash = "sigmoid" if family == "binary" else "softmax"
            out.append(("loss_output_mismatch", "architecture", loss.lineno, (
                f"the last Dense layer (line {layer.node.lineno}) has no activation, so the model "
                f"outputs raw scores (any real number), but the loss `{text}` treats them as "
                "probabilities (from_logits is False): Keras clips the outputs to [1e-7, 1-1e-7]"
                f"{' after dividing by their sum' if family != 'binary' else ''}, so negative "
                "or too large scores get zero gradient and the loss stalls or jumps around. "
                f"Add activation=\"{squash}\" to the last layer, or build the loss with "
                "from_logits=True.")))
    return out


def _squash_twice(kind: str, loss: str) -> str:
    if kind == "softmax":
        effect = ("the outputs are already probabilities in [0, 1], and a softmax over values "
                  "that close together is nearly uniform, so the predicted distribution can "
                  "hardly move: the loss plateaus near log(number of classes) and the gradients "
                  "are tiny")
    else:
        effect = ("the outputs are already in [0, 1], so the loss sees sigmoid(p) between 0.5 "
                  "and 0.73: it can never predict the negative class with confidence, the loss "
                  "has a high floor and the gradients shrink")
    return (f"the last layer applies {kind} and the loss `{loss}` is built with "
            f"from_logits=True, so the loss applies {kind} a second time: {effect} (unless the "
            "framework recovers the logits: Keras on TensorFlow does inside a compiled step and "
            "warns; an eager loop, another backend or an exported model does not). Remove the "
            f"final {kind} (keep from_logits=True), or set from_logits=False.")


# --- fit(): labels and inputs -----------------------------------------------------------------

def _fit_rules(idx: Index, compiles: list) -> list[tuple]:
    out = []
    for c in idx.calls:
        if tail(c) not in ("fit", "train_on_batch") or not isinstance(c.func, ast.Attribute):
            continue
        key = _key(idx, c.func.value, c)
        mine = [(cc, loss) for cc, k, loss in compiles if k == key and key is not None]
        if not isinstance(key, int) and not mine:
            continue  # not a Keras model (e.g. a scikit-learn estimator)
        scope, at = idx.scope_of(c), pos(c)
        x, y = kwarg(c, "x", 0), kwarg(c, "y", 1)
        if x is not None:
            why = _image_evidence(idx, x, scope, at)
            if why and not ((_SCALERS | _TOKEN_LAYERS) & idx.tails) and not _applications(idx):
                out.append(("missing_input_normalization", "data", c.lineno, (
                    f"the inputs `{_short(x, 40)}` reach fit() as raw pixel values ({why}, "
                    "0-255) with no division by 255, no Rescaling/Normalization layer and no "
                    "preprocess_input: first-layer pre-activations are about 255 times larger "
                    "than the initialisation assumes, so units saturate or the gradients and "
                    "the effective step size blow up, and the loss stalls or diverges. Divide "
                    "by 255 (x.astype(\"float32\") / 255) or add layers.Rescaling(1/255) as the "
                    "first layer.")))
        if mine:
            before = [m for m in mine if pos(m[0]) < at] or mine
            comp, loss = before[-1]
            out += _label_rule(idx, c, comp, loss, x, y)
        if tail(c) == "fit" and (_given(kwarg(c, "validation_data")) or
                                 _given(kwarg(c, "validation_split"))):
            out += _stop_rules(idx)
    return out


_STOPPERS = ("EarlyStopping", "ModelCheckpoint", "ReduceLROnPlateau")


def _given(arg: ast.AST | None) -> bool:
    """A ``fit`` argument that is there and not a literal ``None`` / ``0``."""
    return arg is not None and not (isinstance(arg, ast.Constant) and not arg.value)


def _stop_rules(idx: Index) -> list[tuple]:
    """Callbacks that watch a training quantity while ``fit`` has validation data.

    ``EarlyStopping(monitor="loss")`` stops when the training loss stops falling, which it
    does not while the model memorises: the run goes on while validation gets worse (and a
    ``ModelCheckpoint(save_best_only=True, monitor="loss")`` keeps the most overfitted model).
    """
    out = []
    for call in idx.calls:
        if tail(call) not in _STOPPERS:
            continue
        monitor = kwarg(call, "monitor", 0 if tail(call) != "ModelCheckpoint" else 1)
        if not (isinstance(monitor, ast.Constant) and isinstance(monitor.value, str)) or \
                monitor.value.startswith("val"):
            continue
        out.append(("early_stop_on_training", "training_loop", call.lineno, (
            f"{tail(call)} watches `{monitor.value}`, a training quantity, although fit() has "
            "validation data: the training loss keeps improving while the model memorises, so "
            "it never stops (or keeps) the model where validation was best. Watch "
            f"`val_{monitor.value}` (monitor=\"val_loss\").")))
    return out


def _label_rule(idx: Index, fit: ast.Call, comp: ast.Call, loss: ast.AST, x, y) -> list:
    info = loss_info(loss, idx, idx.scope_of(comp), pos(comp))
    if info is None or info[0] not in ("categorical", "sparse"):
        return []
    scope, at = idx.scope_of(fit), pos(fit)
    if y is not None:
        fmt = _label_format(idx, y, scope, at, None)
    else:
        fmt = _label_format(idx, x, scope, at, 1) if x is not None else None
    if fmt is None:
        return []
    found, why = fmt
    text = _short(loss)
    if info[0] == "categorical" and found == "int" and not (_ONEHOT & idx.tails):
        return [("label_format_mismatch", "data", loss.lineno, (
            f"the loss `{text}` expects one-hot label rows (shape (N, classes)), but the labels "
            f"passed to fit() are integer class ids ({why}) and nothing one-hot encodes them "
            "(no to_categorical / one_hot): Keras either rejects the shapes at the first step "
            "or broadcasts the ids against the outputs, so the loss no longer measures the "
            "probability of the right class and accuracy stays near chance. Use "
            "sparse_categorical_crossentropy, or keras.utils.to_categorical(y)."))]
    if info[0] == "sparse" and found == "onehot":
        return [("label_format_mismatch", "data", loss.lineno, (
            f"the loss `{text}` expects one integer class id per sample, but the labels "
            f"passed to fit() are one-hot rows ({why}): each row of 0/1 values is read as "
            "class ids, so the shapes are rejected or the model is trained towards classes 0 "
            "and 1 only, and the loss does not reflect the true classes. Use "
            "categorical_crossentropy, or pass the integer labels (y.argmax(-1))."))]
    return []


def _dataset(idx: Index, call: ast.AST) -> str:
    """``mnist`` for ``keras.datasets.mnist.load_data()`` (also via ``mnist = ...mnist``)."""
    if tail(call) != "load_data" or not isinstance(call.func, ast.Attribute):
        return ""
    owner, _ = idx.value_of(call.func.value, idx.scope_of(call), pos(call))
    return (dotted(owner) or "").split(".")[-1]


def _int_dtype(node: ast.AST | None) -> bool:
    name = const_str(node) or (dotted(node) or "" if node is not None else "")
    name = name.split(".")[-1]
    return name in ("int", "long") or name.startswith(("int", "uint"))


def _label_format(idx: Index, y: ast.AST, scope, at, slot) -> tuple[str, str] | None:
    """``("int" | "onehot", why)`` for the labels reaching fit(), or None when unknown."""
    kind, node, path, chain = idx.trace(y, scope, at, slot)
    if (slot is not None and "slices" not in chain) or kind in ("aug", "unknown"):
        return None
    name = tail(node)
    if kind == "expr" and name in _ONEHOT:
        return "onehot", f"`{name}()` at line {node.lineno}"
    if kind == "unpack":
        ds = _dataset(idx, node)
        if ds in _LABEL_SETS and len(path) == 2 and path[1] == 1:
            return "int", f"`{ds}.load_data()` gives integer class ids"
        return None
    for step in chain:
        if tail(step) == "astype" and step.args and _int_dtype(step.args[0]):
            return "int", f"cast with astype at line {step.lineno}"
    if name in _INT_MAKERS:
        size = kwarg(node, "size", 2)
        if isinstance(size, ast.Tuple) and len(size.elts) > 1 and not (
                isinstance(size.elts[-1], ast.Constant) and size.elts[-1].value == 1):
            return None  # a 2-D integer array may well be multi-hot
        return "int", f"`{name}()` at line {node.lineno}"
    if isinstance(node, ast.List) and node.elts and all(
            isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts):
        return "int", f"a list of integers at line {node.lineno}"
    return None


def _applications(idx: Index) -> bool:
    """keras.applications models may rescale inside (EfficientNet, ConvNeXt): no verdict."""
    return any(".applications" in (dotted(c.func) or "") for c in idx.calls)


def _loads_images(node: ast.AST) -> bool:
    """Some image reader inside ``node`` and no arithmetic that could rescale it."""
    reads = any(tail(n) in _IMAGE_LOADERS or (dotted(getattr(n, "func", None)) or "")
                .endswith("Image.open") for n in ast.walk(node))
    scaled = any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.Mult, ast.Sub))
                 for n in ast.walk(node))
    return reads and not scaled


def _image_evidence(idx: Index, x: ast.AST, scope, at) -> str | None:
    """Why ``x`` holds unscaled image-like values, or None when that cannot be told."""
    kind, node, path, chain = idx.trace(x, scope, at, 0)
    if kind in ("aug", "unknown"):
        return None
    for step in chain:
        if tail(step) == "astype" and step.args and (dotted(step.args[0]) or const_str(
                step.args[0]) or "").endswith("uint8"):
            return f"cast to uint8 at line {step.lineno}"
    if kind == "unpack":
        ds = _dataset(idx, node)
        if ds in _IMAGE_SETS and len(path) == 2 and path[1] == 0:
            return f"`{ds}.load_data()` images are uint8"
        return None
    if isinstance(node, (ast.List, ast.ListComp, ast.GeneratorExp)) or tail(node) in (
            "stack", "concatenate", "vstack"):
        return f"images read at line {node.lineno}" if _loads_images(node) else None
    if not isinstance(node, ast.Call):
        return None
    name = tail(node)
    if name in _IMAGE_LOADERS or (dotted(node.func) or "").endswith("Image.open"):
        return f"`{name}()` at line {node.lineno}"
    dtype = kwarg(node, "dtype")
    if dtype is not None and (dotted(dtype) or const_str(dtype) or "").endswith("uint8"):
        return f"a uint8 array made at line {node.lineno}"
    if name == "randint":
        high = kwarg(node, "high", 1)
        high = high if high is not None else kwarg(node, "low", 0)
        if isinstance(high, ast.Constant) and high.value in (255, 256):
            return f"random integers up to {high.value} at line {node.lineno}"
    if name in ("flow_from_directory", "flow_from_dataframe") \
            and isinstance(node.func, ast.Attribute):
        gen, _ = idx.value_of(node.func.value, idx.scope_of(node), pos(node))
        if tail(gen) == "ImageDataGenerator" and not any(
                kw.arg in _GEN_SCALING or kw.arg is None for kw in gen.keywords):
            return f"an ImageDataGenerator without rescale at line {gen.lineno}"
    return None
