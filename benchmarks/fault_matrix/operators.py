"""Fault operators: source transformations that put one known fault into a training program.

The families follow the taxonomy of real deep-learning faults (Humbatova et al., "Taxonomy of
Real Faults in Deep Learning Systems", ICSE 2020) as listed in issue #17: model, training, data,
loop, resources. Every operator is written against the finders of :class:`program.Program`
(the optimizer constructor, the training loss call, the model, the training data source, the
training loop...), so it applies to any base where its pattern exists; ``applies(source)`` says
whether it does. ``apply(source)`` returns a :class:`mutation.Mutant`: the mutated source, the
changed line, the expected category and root-cause kind, and the expected location (the line
that *makes* the faulty object).

Usage::

    from benchmarks.fault_matrix.operators import OPERATORS
    op = OPERATORS["lr_too_high"]
    if op.applies(source):
        mutant = op.apply(source)
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

try:
    from .mutation import CATEGORIES, ROOT_CAUSES, Edit, Mutant, apply_edits
    from .program import LOGIT_LOSSES, REGRESSION_LOSSES, Program, call_name, dotted, keyword
except ImportError:  # run as a script from this folder
    from mutation import CATEGORIES, ROOT_CAUSES, Edit, Mutant, apply_edits
    from program import LOGIT_LOSSES, REGRESSION_LOSSES, Program, call_name, dotted, keyword

__all__ = ["OPERATORS", "Operator", "NotApplicable", "applicable"]


class NotApplicable(Exception):
    """The operator's pattern is not in this program."""


@dataclass(frozen=True)
class Operator:
    """One fault operator.

    Parameters
    ----------
    id : str
        Stable identifier.
    family : str
        Taxonomy family: ``model``, ``training``, ``data``, ``loop`` or ``resources``.
    category : str
        Expected primary category of a diagnosis.
    root_cause : str
        Expected root-cause kind.
    description : str
        The fault, in words.
    build : callable
        ``build(program) -> list[Edit]``; raises :class:`NotApplicable`.
    also : tuple of str
        Other categories the fault shows as on some programs, for a documented reason
        (too little data is a loss that hardly falls when the run is counted in epochs):
        counted by the matrix's symptom-aware line, never by the strict one.
    """

    id: str
    family: str
    category: str
    root_cause: str
    description: str
    build: Callable[[Program], list[Edit]]
    also: tuple[str, ...] = ()

    def applies(self, source: str) -> bool:
        """Whether the operator's pattern exists in ``source``."""
        try:
            self.build(Program(source))
        except NotApplicable:
            return False
        return True

    def apply(self, source: str) -> Mutant:
        """The mutant of ``source``; raises :class:`NotApplicable` where it does not apply."""
        edits = self.build(Program(source))
        mutated, changed, expected, last = apply_edits(source, edits)
        return Mutant(self.id, mutated, changed, expected, self.category, self.root_cause,
                      self.family, self.description, last)


OPERATORS: dict[str, Operator] = {}


def operator(id: str, family: str, category: str, root_cause: str, description: str,
             also: tuple[str, ...] = ()):
    """Register ``build`` as an operator."""
    assert category in CATEGORIES and root_cause in ROOT_CAUSES, (category, root_cause)
    assert all(c in CATEGORIES for c in also), also

    def register(build):
        OPERATORS[id] = Operator(id, family, category, root_cause, description, build, also)
        return build

    return register


def applicable(source: str) -> list[str]:
    """Ids of the operators that apply to ``source``."""
    return [op_id for op_id, op in OPERATORS.items() if op.applies(source)]


# -- edit helpers -----------------------------------------------------------------------------
def need(value, why: str = ""):
    """``value``, or :class:`NotApplicable` when it is falsy."""
    if not value:
        raise NotApplicable(why)
    return value


def replace(p: Program, node: ast.AST, text: str, **flags) -> Edit:
    start, end = p.span(node)
    return Edit(start, end, text, **flags)


def wrap(p: Program, node: ast.AST, template: str, **flags) -> Edit:
    """Replace ``node`` with ``template.format(x=<its text, parenthesised when needed>)``."""
    text = p.text(node)
    if not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)):
        text = f"({text})"
    return replace(p, node, template.format(x=text), **flags)


def _block(p: Program, stmt: ast.stmt, code: str) -> str:
    ind = p.indent(stmt)
    return "".join(f"{ind}{line}\n" for line in code.splitlines())


def insert_before(p: Program, stmt: ast.stmt, code: str, **flags) -> Edit:
    """Insert statement lines before ``stmt``, at its indentation."""
    pos = p.line_start(stmt.lineno)
    return Edit(pos, pos, _block(p, stmt, code), **flags)


def insert_after(p: Program, stmt: ast.stmt, code: str, **flags) -> Edit:
    """Insert statement lines after ``stmt``, at its indentation."""
    pos = p.line_end(stmt.end_lineno)
    return Edit(pos, pos, _block(p, stmt, code), **flags)


def delete_stmt(p: Program, stmt: ast.stmt, **flags) -> Edit:
    """Remove a statement's lines (``pass`` when it is alone in its block)."""
    parent = p.parents[stmt]
    bodies = [getattr(parent, f, None) for f in ("body", "orelse", "finalbody")]
    alone = any(b == [stmt] for b in bodies if isinstance(b, list))
    if alone:
        return replace(p, stmt, "pass", **flags)
    return Edit(p.line_start(stmt.lineno), p.line_end(stmt.end_lineno), "", **flags)


def set_kwarg(p: Program, call: ast.Call, name: str, value: str, **flags) -> Edit:
    """Set keyword ``name=value`` on ``call`` (replacing it when given)."""
    kw = keyword(call, name)
    if kw is not None:
        return replace(p, kw.value, value, **flags)
    start, end = p.span(call)
    close = end - 1
    assert p.source[close] == ")", p.source[start:end]
    pos = close
    while p.source[pos - 1] in " \t\n":
        pos -= 1
    before = p.source[pos - 1]
    text = f"{name}={value}" if before == "(" else (f" {name}={value}" if before == ","
                                                     else f", {name}={value}")
    return Edit(pos, pos, text, **flags)


def ensure_import(p: Program, module: str, alias: str | None = None) -> list[Edit]:
    """An edit adding ``import module [as alias]`` after the last top-level import, if missing."""
    bound = alias or module.split(".")[0]
    if bound in p.imports():
        return []
    last = None
    for n in p.tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            last = n
    text = f"import {module}" + (f" as {alias}" if alias else "") + "\n"
    pos = p.line_end(last.end_lineno) if last is not None else 0
    return [Edit(pos, pos, text, aux=True)]


def keras_prefix(p: Program) -> str:
    return "keras" if "keras" in p.imports() else "tf.keras"


def number(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = number(node.operand)
        return -inner if inner is not None else None
    return None


def scale_value(p: Program, node: ast.AST, factor: float, **flags) -> Edit:
    """Multiply a numeric argument by ``factor`` (a literal stays a literal)."""
    value = number(node)
    if value is not None:
        return replace(p, node, repr(value * factor), **flags)
    return wrap(p, node, "{x} * " + repr(factor), **flags)


# -- finders shared by operators ---------------------------------------------------------------
def lr_argument(p: Program) -> tuple[ast.Call, ast.AST | None, str]:
    """The optimizer call, its learning-rate node (None if defaulted), and the keyword name."""
    opt = need(p.optimizer() or p.trainer_args(), "no optimizer constructor")
    name = "lr" if p.is_torch and call_name(opt) != "TrainingArguments" else "learning_rate"
    kw = keyword(opt, name)
    if kw is not None:
        return opt, kw.value, name
    index = 1 if p.is_torch else 0
    if len(opt.args) > index:
        return opt, opt.args[index], name
    return opt, None, name


DEFAULT_LR = {"SGD": 1e-3, "Adam": 1e-3, "AdamW": 1e-3, "RMSprop": 1e-2, "Adagrad": 1e-2}


def scale_lr(p: Program, factor: float) -> list[Edit]:
    opt, node, name = lr_argument(p)
    if node is not None:
        return [scale_value(p, node, factor)]
    default = DEFAULT_LR.get(call_name(opt), 1e-3) if p.is_torch else 1e-3
    return [set_kwarg(p, opt, name, repr(default * factor))]


def final_dense(p: Program) -> ast.Call:
    return need(p.dense_layers(), "no Dense layers")[-1]


def dense_activation(call: ast.Call) -> str | None:
    kw = keyword(call, "activation")
    if kw is None:
        return None
    return kw.value.value if isinstance(kw.value, ast.Constant) else dotted(kw.value)


def torch_train_loss(p: Program) -> ast.Call:
    need(p.is_torch, "not PyTorch")
    return need(p.train_loss_call(), "no training loss call")


def model_after(p: Program) -> ast.stmt:
    """The statement after which the model exists (its construction)."""
    return need(p.model_assignment(), "model construction not found")


def data_args(p: Program) -> tuple[ast.Call, ast.expr, ast.expr]:
    return need(p.data_source(), "no training data source")


def named_data(p: Program) -> tuple[ast.Call, str, str]:
    return need(p.named_data_source(), "training data source without plain names")


def token_inputs(p: Program) -> bool:
    """The model reads token ids (an embedding, a Hugging Face ``input_ids``), not features."""
    return "Embedding" in p.source or "input_ids" in p.source


def assignable(node: ast.AST) -> bool:
    return isinstance(node, (ast.Name, ast.Subscript, ast.Attribute))


def classification(p: Program) -> None:
    need(p.is_classification(), "not a classification task")


def loop_body_first(p: Program) -> ast.stmt:
    loop = need(p.train_loop(), "no training loop")
    return loop.body[0]


def outer_loop(p: Program, loop: ast.stmt) -> ast.stmt:
    """The outermost loop around ``loop`` in the same function (the epoch loop)."""
    outer = loop
    for anc in p.ancestors(loop):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            break
        if isinstance(anc, (ast.For, ast.While)):
            outer = anc
    return outer


def model_input(p: Program) -> tuple[ast.stmt, str]:
    """(the statement that calls the model in the training step, the input's name)."""
    loss = torch_train_loss(p)
    pred = loss.args[0]
    model = need(p.model_name(), "model not found")
    call = None
    if isinstance(pred, ast.Call) and call_name(pred) == model:
        call = pred
    elif isinstance(pred, ast.Name):
        assign = p.assignment_of(pred.id, before=loss.lineno)
        if assign is not None and isinstance(assign.value, ast.Call) \
                and call_name(assign.value) == model:
            call = assign.value
    need(call is not None and call.args and isinstance(call.args[0], ast.Name),
         "the model's input is not a plain name")
    return p.statement(call), call.args[0].id


# == model ====================================================================================
@operator("probs_into_logits_loss", "model", "loss_not_decreasing", "architecture",
          "probabilities (softmax/sigmoid output) fed to a loss that expects logits")
def _probs_into_logits_loss(p: Program) -> list[Edit]:
    if p.is_torch:
        loss = torch_train_loss(p)
        kind = need(p.loss_kind(loss) in LOGIT_LOSSES and p.loss_kind(loss), "not a logit loss")
        fn = "torch.sigmoid({x})" if "BCE" in kind or "binary" in kind else \
            "torch.softmax({x}, dim=1)"
        return ensure_import(p, "torch") + [wrap(p, loss.args[0], fn)]
    last = final_dense(p)
    act = dense_activation(last)
    k = keras_prefix(p)
    ctor = p.loss_constructor()
    if act in {"softmax", "sigmoid"}:
        if ctor is not None:
            need(keyword(ctor, "from_logits") is None, "loss sets from_logits")
            return [set_kwarg(p, ctor, "from_logits", "True")]
        comp = need(p.compile_call(), "no compile")
        kw = need(keyword(comp, "loss"), "no loss")
        names = {"sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
                 "categorical_crossentropy": "CategoricalCrossentropy",
                 "binary_crossentropy": "BinaryCrossentropy"}
        name = need(isinstance(kw.value, ast.Constant) and names.get(kw.value.value),
                    "unknown loss")
        return [replace(p, kw.value, f"{k}.losses.{name}(from_logits=True)")]
    need(act in {None, "linear"}, "hidden activation on the output")
    need(ctor is not None and keyword(ctor, "from_logits") is not None
         and isinstance(keyword(ctor, "from_logits").value, ast.Constant)
         and keyword(ctor, "from_logits").value.value is True, "loss does not take logits")
    units = number(last.args[0]) if last.args else None
    return [set_kwarg(p, last, "activation", '"sigmoid"' if units == 1 else '"softmax"')]


@operator("dead_relu_init", "model", "loss_not_decreasing", "architecture",
          "biases initialised to -10 before ReLUs: every unit dead from the start")
def _dead_relu_init(p: Program) -> list[Edit]:
    if p.is_torch:
        need("ReLU" in p.source or "relu" in p.source, "no ReLU")
        model = p.model_name()
        code = (f"for module in {model}.modules():\n"
                "    if isinstance(module, torch.nn.Linear):\n"
                "        torch.nn.init.constant_(module.bias, -10.0)")
        return ensure_import(p, "torch") + [insert_after(p, model_after(p), code)]
    k = keras_prefix(p)
    layers = [d for d in p.dense_layers() if dense_activation(d) == "relu"]
    need(layers, "no relu Dense")
    edits = [set_kwarg(p, d, "bias_initializer", f"{k}.initializers.Constant(-10.0)")
             for d in layers]
    return [dataclasses.replace(edits[0], change=True)] + edits[1:]


_HIDDEN_ACTS = {"relu", "tanh", "gelu", "elu", "selu", "leaky_relu", "silu", "swish"}


@operator("activation_removed", "model", "loss_not_decreasing", "architecture",
          "every hidden activation removed: the stacked layers are one linear model")
def _activation_removed(p: Program) -> list[Edit]:
    if p.is_torch:  # activation modules and functions, up to the last nn.Linear (the output's
        last = max(need([(c.lineno, c.col_offset) for c in p.calls("Linear")],  # own
                        "no nn.Linear"))  # one stays)
        modules = [c for c in p.calls({"ReLU", "Tanh", "GELU", "ELU", "SiLU", "LeakyReLU"})
                   if isinstance(c.func, ast.Attribute)]
        functions = [c for c in p.calls({"relu", "tanh", "gelu", "elu", "silu", "leaky_relu"})
                     if c.args and isinstance(c.func, ast.Attribute)
                     and dotted(c.func.value) in {"F", "torch", "nn.functional",
                                                  "torch.nn.functional"}]
        edits = [replace(p, c, f"{dotted(c.func.value)}.Identity()") for c in modules
                 if (c.lineno, c.col_offset) < last]
        edits += [replace(p, c, p.text(c.args[0])) for c in functions]
    else:
        layers = p.dense_layers()[:-1]  # (the output layer's activation stays)
        edits = [set_kwarg(p, d, "activation", "None") for d in layers
                 if dense_activation(d) in _HIDDEN_ACTS]
    edits = sorted(need(edits, "no hidden activation"), key=lambda e: e.start)
    return [dataclasses.replace(edits[0], change=True)] + edits[1:]


def _torch_param_loop(p: Program, body: str, with_no_grad: bool = True) -> list[Edit]:
    model = p.model_name()
    if with_no_grad:
        code = f"with torch.no_grad():\n    for param in {model}.parameters():\n        {body}"
    else:
        code = f"for param in {model}.parameters():\n    {body}"
    return ensure_import(p, "torch") + [insert_after(p, model_after(p), code)]


def _keras_all_dense(p: Program, name: str, value: str) -> list[Edit]:
    layers = need(p.dense_layers(), "no Dense")
    edits = [set_kwarg(p, d, name, value) for d in layers]
    return [dataclasses.replace(edits[0], change=True)] + edits[1:]


def _self_call(node: ast.AST) -> bool:
    """``self.<layer>(...)`` with a first argument."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        isinstance(node.func.value, ast.Name) and node.func.value.id == "self" and \
        bool(node.args)


@operator("layer_output_discarded", "model", "loss_not_decreasing", "architecture",
          "a layer called in forward/call whose result is thrown away (`self.layer(h)` "
          "where `h = self.layer(h)` was meant): the path goes around it")
def _layer_output_discarded(p: Program) -> list[Edit]:
    methods = [f for f in ast.walk(p.tree)
               if isinstance(f, ast.FunctionDef) and f.name in ("forward", "call")]
    for stmt in (s for f in methods for s in ast.walk(f)):  # h = self.layer(h, ...)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                isinstance(stmt.targets[0], ast.Name) and _self_call(stmt.value) and \
                isinstance(stmt.value.args[0], ast.Name) and \
                stmt.value.args[0].id == stmt.targets[0].id:
            return [replace(p, stmt, p.text(stmt.value), change=True)]
    for outer in (c for f in methods for c in ast.walk(f)):  # self.a(self.layer(...))
        if _self_call(outer) and _self_call(outer.args[0]):
            return _discard_nested(p, p.statement(outer), outer.args[0])
    raise NotApplicable("no layer call in forward/call to discard")


def _discard_nested(p: Program, stmt: ast.stmt, inner: ast.Call) -> list[Edit]:
    """``self.a(self.layer(x))`` becomes ``kept = x``, ``self.layer(kept)``, ``self.a(kept)``."""
    ind, (start, _), (a, b) = p.indent(stmt), p.span(inner), p.span(inner.args[0])
    text = p.text(inner)
    code = f"{ind}kept = {p.text(inner.args[0])}\n"
    call = f"{ind}{text[:a - start]}kept{text[b - start:]}\n"
    pos = p.line_start(stmt.lineno)
    return [Edit(pos, pos, code, aux=True), Edit(pos, pos, call, change=True),
            Edit(*p.span(inner), "kept", aux=True)]


@operator("padding_unmasked", "model", "loss_not_decreasing", "architecture",
          "the padding of variable-length sequences no longer masked (Keras mask_zero=True "
          "dropped, PyTorch pack_padded_sequence skipped): the recurrent layer steps through "
          "it")
def _padding_unmasked(p: Program) -> list[Edit]:
    edits = []
    for c in p.calls():
        name = call_name(c)
        kw = keyword(c, "mask_zero")
        if name == "Embedding" and kw is not None and p.text(kw.value) == "True":
            edits.append(replace(p, kw.value, "False"))
        elif name == "pack_padded_sequence" and c.args:
            edits.append(replace(p, c, p.text(c.args[0])))
    need(edits, "no masked or packed padding")
    return [dataclasses.replace(edits[0], change=True)] + edits[1:]


@operator("init_huge_weights", "model", "gradient_instability", "architecture",
          "weights initialised 25x too large")
def _init_huge(p: Program) -> list[Edit]:
    if p.is_torch:
        return _torch_param_loop(p, "param.mul_(25.0)")
    return _keras_all_dense(p, "kernel_initializer",
                            f"{keras_prefix(p)}.initializers.RandomNormal(stddev=10.0)")


@operator("init_zero_weights", "model", "loss_not_decreasing", "architecture",
          "every weight initialised to zero (symmetry never broken)")
def _init_zero(p: Program) -> list[Edit]:
    if p.is_torch:
        return _torch_param_loop(p, "torch.nn.init.zeros_(param)", with_no_grad=False)
    return _keras_all_dense(p, "kernel_initializer", '"zeros"')


@operator("dropout_extreme", "model", "loss_not_decreasing", "architecture",
          "dropout rate raised to 0.9")
def _dropout_extreme(p: Program) -> list[Edit]:
    edits = []
    for c in p.calls():
        name = call_name(c)
        if name == "Dropout":
            kw = keyword(c, "p") or keyword(c, "rate")
            node = kw.value if kw is not None else (c.args[0] if c.args else None)
            edits.append(replace(p, node, "0.9") if node is not None
                         else set_kwarg(p, c, "p", "0.9"))
        elif keyword(c, "dropout") is not None and name != "Dropout":
            edits.append(set_kwarg(p, c, "dropout", "0.9"))
    need(edits, "no dropout")
    return [dataclasses.replace(edits[0], change=True)] + edits[1:]


@operator("output_sigmoid_regression", "model", "convergence_to_wrong_solution",
          "architecture", "a sigmoid on a regression output (predictions confined to (0, 1))")
def _output_sigmoid_regression(p: Program) -> list[Edit]:
    need(p.is_torch, "the loss kind of a Keras model is not read here")
    loss = torch_train_loss(p)
    need(p.loss_kind(loss) in REGRESSION_LOSSES, "not a regression loss")
    return ensure_import(p, "torch") + [wrap(p, loss.args[0], "torch.sigmoid({x})")]


@operator("freeze_layers", "model", "loss_not_decreasing", "architecture",
          "every layer but the output frozen (requires_grad False / trainable False)")
def _freeze_layers(p: Program) -> list[Edit]:
    model = p.model_name()
    if p.is_torch:
        code = (f"for param in list({model}.parameters())[:-2]:\n"
                "    param.requires_grad_(False)")
    else:
        code = f"for layer in {model}.layers[:-1]:\n    layer.trainable = False"
    return [insert_after(p, model_after(p), code)]


@operator("output_relu", "model", "convergence_to_wrong_solution", "architecture",
          "a ReLU on the output of a regression / logit model (negative outputs impossible)")
def _output_relu(p: Program) -> list[Edit]:
    if p.is_torch:
        loss = torch_train_loss(p)
        kind = p.loss_kind(loss)
        need(kind in REGRESSION_LOSSES or kind in {"BCEWithLogitsLoss",
                                                   "binary_cross_entropy_with_logits"},
             "output can be negative only in regression / binary logits")
        return ensure_import(p, "torch") + [wrap(p, loss.args[0], "torch.relu({x})")]
    last = final_dense(p)
    need(dense_activation(last) in {None, "linear"}, "output already has an activation")
    return [set_kwarg(p, last, "activation", '"relu"')]


# == training =================================================================================
@operator("lr_too_high", "training", "gradient_instability", "hyperparameter",
          "learning rate 1000x too high")
def _lr_too_high(p: Program) -> list[Edit]:
    return scale_lr(p, 1000.0)


@operator("lr_too_low", "training", "loss_not_decreasing", "hyperparameter",
          "learning rate 10000x too low")
def _lr_too_low(p: Program) -> list[Edit]:
    return scale_lr(p, 1e-4)


@operator("schedule_decay_fast", "training", "loss_not_decreasing", "hyperparameter",
          "learning-rate schedule that decays to ~0 within a few steps")
def _schedule_decay_fast(p: Program) -> list[Edit]:
    sched = need(p.scheduler(), "no scheduler")
    name = call_name(sched)
    if name == "StepLR":
        return [set_kwarg(p, sched, "gamma", "0.02"), set_kwarg(p, sched, "step_size", "1")]
    if name == "ExponentialLR":
        return [set_kwarg(p, sched, "gamma", "0.05")]
    if name == "LambdaLR":
        fn = next((a for a in sched.args[1:] if isinstance(a, ast.Lambda)), None)
        fn = fn or (keyword(sched, "lr_lambda").value if keyword(sched, "lr_lambda") else None)
        need(isinstance(fn, ast.Lambda) and fn.args.args, "lr_lambda is not a lambda")
        arg = fn.args.args[0].arg
        return [wrap(p, fn.body, "{x} * 0.7 ** " + arg)]
    raise NotApplicable(f"scheduler {name}")


ADAPTIVE = {"Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "Nadam"}
ADAPTIVE_ONLY_KW = {"betas", "eps", "amsgrad", "beta_1", "beta_2", "epsilon", "rho", "alpha",
                    "centered"}


@operator("optimizer_sgd_swap", "training", "loss_not_decreasing", "hyperparameter",
          "an adaptive optimizer replaced by plain SGD at the same (small) learning rate")
def _optimizer_swap(p: Program) -> list[Edit]:
    opt = need(p.optimizer(), "no optimizer")
    name = call_name(opt)
    need(name in ADAPTIVE, "not an adaptive optimizer")
    need(not any(kw.arg in ADAPTIVE_ONLY_KW for kw in opt.keywords), "adaptive-only keywords")
    need(len(opt.args) <= (2 if p.is_torch else 1), "positional hyperparameters")
    start, end = p.span(opt.func)
    edits = [Edit(end - len(name), end, "SGD", change=True)]
    _, node, kwname = lr_argument(p)
    if node is None:  # keep the adaptive optimizer's default learning rate
        edits.append(set_kwarg(p, opt, kwname, "0.001"))
    return edits


@operator("batch_size_full", "training", "loss_not_decreasing", "hyperparameter",
          "the whole training set in one batch: a handful of steps in all")
def _batch_size_full(p: Program) -> list[Edit]:
    return _set_batch_size(p, "100000")


def _set_batch_size(p: Program, value: str) -> list[Edit]:
    loader = p.train_loader()
    if loader is not None:
        return [set_kwarg(p, loader, "batch_size", value)]
    fits = p.calls("fit")
    if fits and not p.is_torch:
        return [set_kwarg(p, fits[0], "batch_size", value)]
    batches = [c for c in p.calls("batch") if c.args]
    if batches and not p.is_torch:
        return [replace(p, batches[0].args[0], value)]
    raise NotApplicable("no batch size")


@operator("weight_decay_huge", "training", "loss_not_decreasing", "hyperparameter",
          "weight decay of 5.0: the weights are pulled to zero")
def _weight_decay_huge(p: Program) -> list[Edit]:
    opt = need(p.optimizer(), "no optimizer")
    return [set_kwarg(p, opt, "weight_decay", "5.0")]


@operator("loss_reduction_sum", "training", "gradient_instability", "hyperparameter",
          "loss summed over the batch instead of averaged (gradients scale with batch size)")
def _loss_reduction_sum(p: Program) -> list[Edit]:
    if p.is_torch:
        loss = torch_train_loss(p)
        ctor = p.loss_constructor()
        target = ctor if ctor is not None else loss
        need(keyword(target, "reduction") is None, "reduction already set")
        return [set_kwarg(p, target, "reduction", '"sum"')]
    ctor = need(p.loss_constructor(), "no loss object")
    return [set_kwarg(p, ctor, "reduction", '"sum"')]


@operator("broadcast_target", "training", "convergence_to_wrong_solution", "training_loop",
          "(B, 1) predictions against a (B,) target: the loss broadcasts to (B, B)")
def _broadcast_target(p: Program) -> list[Edit]:
    loss = torch_train_loss(p)
    need(p.loss_kind(loss) in REGRESSION_LOSSES, "not a regression loss")
    return [wrap(p, loss.args[1], "{x}.view(-1)")]


@operator("broadcast_by_hand", "training", "convergence_to_wrong_solution", "training_loop",
          "the regression loss written by hand as a squared error, (B, 1) predictions minus "
          "a (B,) target: it broadcasts to (B, B)")
def _broadcast_by_hand(p: Program) -> list[Edit]:
    loss = torch_train_loss(p)
    need(p.loss_kind(loss) in REGRESSION_LOSSES, "not a regression loss")
    need(len(loss.args) == 2 and not loss.keywords, "not a plain loss(pred, target) call")
    pred, target = p.text(loss.args[0]), p.text(loss.args[1])
    return [replace(p, loss, f"(({pred}) - ({target}).view(-1)).pow(2).mean()", change=True)]


@operator("sqrt_at_zero", "training", "gradient_instability", "training_loop",
          "a hand-written penalty on the pairwise distances of the predictions takes the square "
          "root of squared distances that are exactly 0 on the diagonal: its gradient is "
          "inf * 0 = NaN while the loss stays finite")
def _sqrt_at_zero(p: Program) -> list[Edit]:
    loss = torch_train_loss(p)
    need(loss.args, "no prediction argument")
    pred = p.text(loss.args[0])
    text = p.text(loss)
    if any(isinstance(n, ast.Call) for n in ast.walk(loss.args[0])):  # the model called in
        start = loss.args[0].col_offset - loss.col_offset  # the loss call: named once
        need(loss.args[0].lineno == loss.lineno, "a prediction over several lines")
        text = f"{text[:start]}(_pred := {pred}){text[start + len(pred):]}"
        pred = "_pred"
    flat = f"{pred}.reshape(len({pred}), -1)"
    penalty = f"(({flat}[:, None] - {flat}[None]) ** 2).sum(-1).sqrt().mean()"
    return [replace(p, loss, f"{text} + 1e-3 * {penalty}", change=True)]


@operator("schedule_rises", "training", "gradient_instability", "hyperparameter",
          "the learning-rate schedule raises the rate instead of lowering it or stopping at it "
          "(a StepLR gamma of 10; a warm-up that never stops)")
def _schedule_rises(p: Program) -> list[Edit]:
    need(p.is_torch, "PyTorch only")
    sched = need(next((c for c in p.calls() if call_name(c) in ("StepLR", "ExponentialLR",
                                                                "LambdaLR")), None),
                 "no StepLR / ExponentialLR / LambdaLR")
    if call_name(sched) == "LambdaLR":
        fn = keyword(sched, "lr_lambda")
        node = fn.value if fn is not None else (sched.args[1] if len(sched.args) > 1 else None)
        need(isinstance(node, ast.Lambda) and len(node.args.args) == 1, "no inline lambda")
        step = node.args.args[0].arg
        return [replace(p, node.body, f"({step} + 1) / 4", change=True)]
    gamma = keyword(sched, "gamma")
    node = gamma.value if gamma is not None else (sched.args[2] if len(sched.args) > 2 else None)
    need(node is not None, "no gamma")
    return [replace(p, node, "10.0", change=True)]


@operator("clip_tiny", "training", "loss_not_decreasing", "hyperparameter",
          "gradient norm clipped to 1e-4")
def _clip_tiny(p: Program) -> list[Edit]:
    if p.is_torch:
        clip = p.clip_call()
        if clip is not None:
            kw = keyword(clip, "max_norm") or keyword(clip, "clip_value")
            node = kw.value if kw is not None else (clip.args[1] if len(clip.args) > 1 else None)
            need(node is not None, "clip without a bound")
            return [replace(p, node, "1e-4")]
        step = need(p.step_stmt(), "no optimizer.step()")
        model = need(p.model_name(), "no model")
        return ensure_import(p, "torch") + [insert_before(
            p, step, f"torch.nn.utils.clip_grad_norm_({model}.parameters(), max_norm=1e-4)")]
    opt = need(p.optimizer(), "no optimizer")
    return [set_kwarg(p, opt, "clipnorm", "1e-4")]


@operator("momentum_too_high", "training", "gradient_instability", "hyperparameter",
          "SGD momentum 0.999")
def _momentum_too_high(p: Program) -> list[Edit]:
    opt = need(p.optimizer(), "no optimizer")
    need(call_name(opt) == "SGD" and keyword(opt, "momentum") is not None, "no SGD momentum")
    return [set_kwarg(p, opt, "momentum", "0.999")]


# == data =====================================================================================
@operator("inputs_scaled", "data", "gradient_instability", "data",
          "training inputs multiplied by 1000 (a unit error in the features)")
def _inputs_scaled(p: Program) -> list[Edit]:
    need(not token_inputs(p), "token ids: no features to scale")
    _, x, _ = data_args(p)
    return [wrap(p, x, "{x} * 1000.0")]


@operator("targets_scaled", "data", "gradient_instability", "data",
          "regression targets multiplied by 1000 (not standardised)")
def _targets_scaled(p: Program) -> list[Edit]:
    need(p.is_regression(), "not a regression task")
    _, _, y = data_args(p)
    return [wrap(p, y, "{x} * 1000.0")]


@operator("labels_shuffled", "data", "loss_not_decreasing", "data",
          "targets shuffled with their own permutation (inputs and labels no longer paired)")
def _labels_shuffled(p: Program) -> list[Edit]:
    call, _, y = data_args(p)
    edits = ensure_import(p, "numpy", "np")
    if isinstance(y, ast.Name):
        return edits + [insert_before(p, p.statement(call),
                                      f"{y.id} = {y.id}[np.random.permutation(len({y.id}))]")]
    text = p.text(y)
    return edits + [replace(p, y, f"{text}[np.random.permutation(len({text}))]")]


@operator("few_samples", "data", "overfitting", "data",
          "only 24 training samples", also=("loss_not_decreasing",))  # (a run counted in
# epochs then takes a handful of steps: the loss hardly falls before it memorises anything)
def _few_samples(p: Program) -> list[Edit]:
    _, x, y = data_args(p)
    return [wrap(p, x, "{x}[:24]", change=True), wrap(p, y, "{x}[:24]")]


@operator("nan_inputs", "data", "gradient_instability", "data",
          "every 50th training sample has NaN features")
def _nan_inputs(p: Program) -> list[Edit]:
    need(not token_inputs(p), "token ids: integers hold no NaN")
    call, x, _ = data_args(p)
    need(assignable(x), "inputs are not assignable")
    return [insert_before(p, p.statement(call), f'{p.text(x)}[::50] = float("nan")')]


@operator("class_imbalance", "data", "convergence_to_wrong_solution", "data",
          "all but 5% of the non-zero classes dropped from the training set")
def _class_imbalance(p: Program) -> list[Edit]:
    classification(p)
    call, x, y = named_data(p)
    code = (f"keep = np.asarray({y} == 0) | (np.arange(len({y})) % 20 == 0)\n"
            f"{x}, {y} = {x}[keep], {y}[keep]")
    return ensure_import(p, "numpy", "np") + [insert_before(p, p.statement(call), code,
                                                            change=True)]


def _feeding(p: Program, expr: ast.AST | None) -> set[str]:
    """The names ``expr`` reads and, through the assignments that make them, what those read."""
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} if expr is not None \
        else set()
    while True:
        more = {r.id for n in p.nodes if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)
                for r in ast.walk(n.value) if isinstance(r, ast.Name)} - names
        if not more:
            return names
        names |= more


def _assigned(stmt: ast.stmt) -> set[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _normalisations(p: Program) -> list[tuple[ast.AST, ast.AST]]:
    """(the normalising expression, what it normalises): ``(x - m) / s`` and ``scaler.transform``.

    Not one that makes the targets only (a label computed from standardised columns): removing
    it changes the labels, not the inputs' scale.
    """
    source = p.data_source()
    inputs, targets = (_feeding(p, source[1]), _feeding(p, source[2])) if source else (set(), set())
    found = []
    for n in p.nodes:
        made = _assigned(p.statement(n)) if n in p.parents else set()
        if made and made <= targets - inputs:
            continue
        if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                and isinstance(n.left, ast.BinOp) and isinstance(n.left.op, ast.Sub)):
            found.append((n, n.left.left))
        elif (isinstance(n, ast.Call) and call_name(n) in {"transform", "fit_transform"}
              and len(n.args) == 1 and "scaler" in dotted(n.func).lower()):
            found.append((n, n.args[0]))
    return found


@operator("normalization_removed", "data", "gradient_instability", "data",
          "input standardisation removed (raw feature scales)")
def _normalization_removed(p: Program) -> list[Edit]:
    found = need(_normalisations(p), "no standardisation")
    edits = [replace(p, n, p.text(inner)) for n, inner in found]
    return [dataclasses.replace(edits[0], change=True)] + edits[1:]


@operator("val_inputs_scaled", "data", "overfitting", "data",
          "validation inputs preprocessed differently from training (scaled by 10)")
def _val_inputs_scaled(p: Program) -> list[Edit]:
    need(not token_inputs(p), "token inputs")
    if p.is_torch:
        call = need(p.val_model_call(), "no validation forward")
    else:
        model = need(p.model_name(), "no model")
        call = next((c for c in p.calls(model) if isinstance(c.func, ast.Name) and c.args
                     and keyword(c, "training") is not None
                     and isinstance(keyword(c, "training").value, ast.Constant)
                     and keyword(c, "training").value.value is False), None)
        need(call, "no validation forward")
    return [wrap(p, call.args[0], "{x} * 10.0")]


@operator("val_labels_renumbered", "data", "convergence_to_wrong_solution", "data",
          "validation labels numbered otherwise than training's (each class id moved one on, "
          "as an encoder fitted on the validation split alone would)")
def _val_labels_renumbered(p: Program) -> list[Edit]:
    classification(p)
    need(p.task_loss() not in ("binary_crossentropy", "bce", "bce_with_logits",
                               "binary_cross_entropy", "binary_cross_entropy_with_logits",
                               "BCELoss", "BCEWithLogitsLoss"), "one output for two classes")
    if p.is_torch:
        target = _val_target(p)
        step = next((f for f in ast.walk(p.tree) if isinstance(f, ast.FunctionDef)
                     and f.name == "validation_step"), None)
        if step is not None and isinstance(target, ast.Name):  # every use in the step
            name = target.id
            first = next(s for s in step.body if not isinstance(s, ast.Expr)
                         or not isinstance(s.value, ast.Constant))
            return [insert_after(p, first, f"{name} = ({name} + 1) % ({name}.max() + 1)",
                                 change=True)]
    else:
        fit = need(p.calls("fit"), "no fit")[0]
        held = need(keyword(fit, "validation_data"), "no validation_data").value
        need(isinstance(held, ast.Tuple) and len(held.elts) == 2, "validation_data not (x, y)")
        target = held.elts[1]
    one_hot = p.task_loss() in ("categorical_crossentropy",)
    template = "np.roll({x}, 1, axis=-1)" if one_hot else "({x} + 1) % ({x}.max() + 1)"
    edits = [wrap(p, target, template, change=True)]
    return edits + (ensure_import(p, "numpy", "np") if one_hot else [])


def _val_target(p: Program) -> ast.expr:
    """The validation labels where an evaluation uses them (PyTorch).

    The target of a loss inside ``no_grad`` beside the validation forward, or of a loss in a
    ``validation_step``; else the labels an accuracy compares the validation predictions with
    (``(model(X_val).argmax(1) == y_val)``).
    """
    steps = [f for f in ast.walk(p.tree)
             if isinstance(f, ast.FunctionDef) and f.name == "validation_step"]
    in_step = [c for f in steps for c in ast.walk(f) if isinstance(c, ast.Call)
               and p.loss_kind(c) is not None and len(c.args) >= 2]
    if in_step:
        return in_step[0].args[1]
    val = need(p.val_model_call(), "no validation forward")
    losses = [c for c in p.calls() if p.loss_kind(c) is not None and p.in_no_grad(c)
              and len(c.args) >= 2 and p.loop_of(c) is p.loop_of(val)]
    if losses:
        return losses[0].args[1]
    made = {t.id for n in ast.walk(p.tree) if isinstance(n, ast.Assign)
            and any(v is val for v in ast.walk(n.value)) for t in n.targets
            if isinstance(t, ast.Name)}  # val_logits = model(val_tokens)
    compares = [c for c in ast.walk(p.tree) if isinstance(c, ast.Compare) and p.in_no_grad(c)
                and len(c.ops) == 1 and isinstance(c.ops[0], ast.Eq)
                and any(n is val or isinstance(n, ast.Name) and n.id in made
                        for n in ast.walk(c.left))]
    return need(compares, "no validation loss or accuracy")[0].comparators[0]


@operator("sorted_no_shuffle", "data", "loss_not_decreasing", "data",
          "training set sorted by target and never shuffled")
def _sorted_no_shuffle(p: Program) -> list[Edit]:
    call, x, y = named_data(p)
    code = (f"order = np.argsort(np.asarray({y}).reshape(len({y}), -1)[:, 0], kind=\"stable\")\n"
            f"{x}, {y} = {x}[order], {y}[order]")
    edits = ensure_import(p, "numpy", "np") + [insert_before(p, p.statement(call), code,
                                                             change=True)]
    loader = p.train_loader()
    if loader is not None and keyword(loader, "shuffle") is not None:
        edits.append(set_kwarg(p, loader, "shuffle", "False"))
    elif call_name(call) == "fit":
        edits.append(set_kwarg(p, call, "shuffle", "False"))
    elif p.is_torch and loader is None:
        raise NotApplicable("no loader")
    return edits


@operator("duplicate_rows", "data", "overfitting", "data",
          "the training set is 32 distinct rows repeated")
def _duplicate_rows(p: Program) -> list[Edit]:
    call, x, y = named_data(p)
    code = f"rows = np.arange(len({y})) % 32\n{x}, {y} = {x}[rows], {y}[rows]"
    return ensure_import(p, "numpy", "np") + [insert_before(p, p.statement(call), code,
                                                            change=True)]


@operator("inputs_constant", "data", "loss_not_decreasing", "data",
          "training inputs zeroed (a broken preprocessing step)")
def _inputs_constant(p: Program) -> list[Edit]:
    _, x, _ = data_args(p)
    # token ids stay integers (every token id 0); features become 0.0
    return [wrap(p, x, "{x} * 0" if token_inputs(p) else "{x} * 0.0")]


@operator("target_leak_feature", "data", "overfitting", "data",
          "the target copied into the first training feature (not in validation)")
def _target_leak(p: Program) -> list[Edit]:
    need(not token_inputs(p), "token ids: no feature column to leak into")
    call, x, y = data_args(p)
    need(assignable(x), "inputs are not assignable")
    xt, yt = p.text(x), p.text(y)
    return [insert_before(p, p.statement(call),
                          f"{xt}.reshape(len({xt}), -1)[:, 0] = {yt}.reshape(-1)")]


@operator("labels_constant", "data", "convergence_to_wrong_solution", "data",
          "every training label set to class 0")
def _labels_constant(p: Program) -> list[Edit]:
    classification(p)
    _, _, y = data_args(p)
    return [wrap(p, y, "{x} * 0")]


# == loop =====================================================================================
@operator("missing_zero_grad", "loop", "gradient_instability", "training_loop",
          "optimizer.zero_grad written without its call: gradients accumulate")
def _missing_zero_grad(p: Program) -> list[Edit]:
    stmt = need(p.zero_grad_stmt(), "no zero_grad()")
    return [replace(p, stmt.value, p.text(stmt.value.func))]


@operator("zero_grad_after_backward", "loop", "loss_not_decreasing", "training_loop",
          "zero_grad() between backward() and step(): every step applies a zero gradient")
def _zero_grad_after_backward(p: Program) -> list[Edit]:
    zg = need(p.zero_grad_stmt(), "no zero_grad()")
    bw = need(p.backward_stmt(), "no backward()")
    need(p.parents[zg] is p.parents[bw], "zero_grad and backward in different blocks")
    return [delete_stmt(p, zg), insert_after(p, bw, p.text(zg), change=True)]


@operator("optimizer_stale_params", "loop", "loss_not_decreasing", "training_loop",
          "the optimizer is built over a copy of the model, not the model that is trained")
def _optimizer_stale(p: Program) -> list[Edit]:
    need(p.is_torch, "PyTorch only")
    opt = need(p.optimizer(), "no optimizer")
    model = need(p.model_name(), "no model")
    return ensure_import(p, "copy") + [replace(p, opt.args[0],
                                               f"copy.deepcopy({model}).parameters()")]


@operator("optimizer_partial_params", "loop", "loss_not_decreasing", "training_loop",
          "the optimizer is given only the last layer's parameters: the rest never updates")
def _optimizer_partial(p: Program) -> list[Edit]:
    need(p.is_torch, "PyTorch only")
    opt = need(p.optimizer(), "no optimizer")
    model = need(p.model_name(), "no model")
    need(opt.args and "parameters()" in p.text(opt.args[0]), "parameters not passed directly")
    return [replace(p, opt.args[0], f"list({model}.parameters())[-2:]")]


@operator("detach_prediction", "loop", "loss_not_decreasing", "training_loop",
          "the prediction is detached before the loss: no gradient reaches the model")
def _detach_prediction(p: Program) -> list[Edit]:
    loss = torch_train_loss(p)
    return [wrap(p, loss.args[0], "{x}.detach().requires_grad_()")]


@operator("detach_hidden", "loop", "loss_not_decreasing", "training_loop",
          "an intermediate activation detached in forward(): the layers below never learn")
def _detach_hidden(p: Program) -> list[Edit]:
    fwd = need(p.forward_method(), "no forward()")
    for stmt in fwd.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            return [wrap(p, stmt.value, "{x}.detach()")]
    raise NotApplicable("no single-name assignment in forward()")


@operator("stop_gradient_hidden", "loop", "loss_not_decreasing", "training_loop",
          "a Keras model stops the gradient after its last hidden layer: the layers below never "
          "learn")
def _stop_gradient_hidden(p: Program) -> list[Edit]:
    need(not p.is_torch, "Keras only (detach_hidden is PyTorch's)")
    dense = need(p.dense_layers()[:-1], "no hidden Dense")[-1]
    k = keras_prefix(p)
    parent = p.parents[dense]
    if isinstance(parent, ast.List):  # Sequential([...]): a layer after it
        return [replace(p, dense, f"{p.text(dense)}, "
                        f"{k}.layers.Lambda(lambda t: {k}.ops.stop_gradient(t))")]
    if isinstance(parent, ast.Call) and parent.func is dense:  # functional: Dense(...)(x)
        return [wrap(p, parent, f"{k}.ops.stop_gradient({{x}})")]
    raise NotApplicable("the hidden layer is neither in a list nor called on a tensor")


@operator("step_removed", "loop", "loss_not_decreasing", "training_loop",
          "optimizer.step() / apply_gradients() missing")
def _step_removed(p: Program) -> list[Edit]:
    stmt = p.step_stmt() if p.is_torch else p.apply_gradients_stmt()
    stmt = need(stmt, "no step")
    parent = p.parents[stmt]
    body = next(b for b in (getattr(parent, f, None) for f in ("body", "orelse"))
                if isinstance(b, list) and stmt in b)
    i = body.index(stmt)
    need(i > 0, "step is the first statement")
    prev = body[i - 1]
    # the deletion is recorded on the statement it follows (where the step belongs)
    return [delete_stmt(p, stmt),
            Edit(p.line_start(prev.lineno), p.line_start(prev.lineno), "", change=True)]


@operator("batch_loop_exit", "loop", "loss_not_decreasing", "training_loop",
          "the batch loop is left after its first step (a break or return one indent too "
          "deep): every epoch trains on one batch")
def _batch_loop_exit(p: Program) -> list[Edit]:
    stmt = p.step_stmt() if p.is_torch else p.apply_gradients_stmt()
    stmt = need(stmt, "no step")
    loop = need(p.loop_of(stmt), "the step is not in a loop")
    need(isinstance(loop, ast.For) and p.parents[stmt] is loop, "no batch loop around the step")
    need(outer_loop(p, loop) is not loop, "no epoch loop around the batch loop")
    return [insert_after(p, stmt, "break", change=True)]


@operator("graph_kept", "loop", "memory_issue", "training_loop",
          "every step's predictions kept in a list with their autograd graph")
def _graph_kept(p: Program) -> list[Edit]:
    stmt, inp = model_input(p)
    model = p.model_name()
    loop = need(p.train_loop(), "no loop")
    bw = need(p.backward_stmt(), "no backward")
    need(p.loop_of(stmt) is loop, "model called outside the loop body")
    return [insert_before(p, outer_loop(p, loop), "kept_outputs = []"),
            insert_after(p, bw, f"kept_outputs.append({model}({inp}))", change=True)]


# == resources ================================================================================
@operator("per_step_stall", "resources", "performance_issue", "training_loop",
          "a blocking 20 ms wait in every training step (a synchronous log/flush)")
def _per_step_stall(p: Program) -> list[Edit]:
    first = loop_body_first(p)
    return ensure_import(p, "time") + [insert_before(p, first, "time.sleep(0.02)",
                                                     change=True)]


@operator("checkpoint_every_step", "resources", "performance_issue", "training_loop",
          "the trainer saves a checkpoint after every step (Keras ModelCheckpoint save_freq=1, "
          "Lightning every_n_train_steps=1, Hugging Face save_steps=1)")
def _checkpoint_every_step(p: Program) -> list[Edit]:
    args = p.trainer_args()
    if args is not None:  # Hugging Face: the TrainingArguments configure the trainer's saving
        return [set_kwarg(p, args, "save_strategy", '"steps"', change=True),
                set_kwarg(p, args, "save_steps", "1")]
    trainers = [c for c in p.calls("Trainer") if "." in dotted(c.func)]
    if trainers and p.is_torch:  # Lightning (``pl.Trainer``): a ModelCheckpoint callback
        trainer = trainers[0]
        need(keyword(trainer, "callbacks") is None, "callbacks already set")
        pl = dotted(trainer.func).rsplit(".", 1)[0]
        ckpt = (f"{pl}.callbacks.ModelCheckpoint(dirpath=tempfile.mkdtemp(), "
                "every_n_train_steps=1, save_top_k=-1)")
        edits = ensure_import(p, "tempfile") + [
            set_kwarg(p, trainer, "callbacks", f"[{ckpt}]", change=True)]
        if keyword(trainer, "enable_checkpointing") is not None:
            edits.append(set_kwarg(p, trainer, "enable_checkpointing", "True"))
        return edits
    fits = [c for c in p.calls("fit") if not p.is_torch]
    fit = need(fits[0] if fits else None, "no Keras fit")
    need(keyword(fit, "callbacks") is None, "callbacks already set")
    k = keras_prefix(p)
    ckpt = f'{k}.callbacks.ModelCheckpoint(tempfile.mkdtemp() + "/m.keras", save_freq=1)'
    return ensure_import(p, "tempfile") + [set_kwarg(p, fit, "callbacks", f"[{ckpt}]",
                                                     change=True)]


@operator("tf_function_retrace", "resources", "performance_issue", "training_loop",
          "a Python float (a timestamp) passed to the tf.function step on every call: each "
          "call traces a new graph")
def _tf_function_retrace(p: Program) -> list[Edit]:
    step = next((f for f in ast.walk(p.tree) if isinstance(f, ast.FunctionDef) and any(
        p.text(d).endswith("tf.function") for d in f.decorator_list) and f.args.args), None)
    step = need(step, "no tf.function step")
    call = next((c for c in ast.walk(p.tree) if isinstance(c, ast.Call) and
                 isinstance(c.func, ast.Name) and c.func.id == step.name and
                 p.loop_of(c) is not None), None)
    call = need(call, "the tf.function step is not called in a loop")
    last = step.args.args[-1]
    need(not step.args.defaults and not step.args.kwonlyargs, "the step has defaults")
    return ensure_import(p, "time") + [
        replace(p, last, f"{p.text(last)}, now=0.0"),
        set_kwarg(p, call, "now", "time.perf_counter()", change=True)]


@operator("slow_collate", "resources", "performance_issue", "data",
          "a slow Python collate function in the training DataLoader")
def _slow_collate(p: Program) -> list[Edit]:
    loader = need(p.train_loader(), "no DataLoader")
    need(keyword(loader, "collate_fn") is None, "collate_fn already set")
    fn = "lambda batch: time.sleep(0.02) or torch.utils.data.default_collate(batch)"
    return ensure_import(p, "time") + ensure_import(p, "torch") + [
        set_kwarg(p, loader, "collate_fn", fn, change=True)]


@operator("pad_to_max", "resources", "performance_issue", "data",
          "every batch padded to the model's maximum length instead of its longest sequence "
          "(a collate_fn's pad_sequence given a row of MAX_LEN padding)")
def _pad_to_max(p: Program) -> list[Edit]:
    need(p.is_torch, "PyTorch only")
    pad = need(next((c for c in p.calls() if call_name(c) == "pad_sequence" and c.args), None),
               "no pad_sequence call")
    width = next((t.id for st in p.tree.body if isinstance(st, ast.Assign)
                  for t in st.targets if isinstance(t, ast.Name) and "LEN" in t.id.upper()
                  and isinstance(st.value, ast.Constant)), "128")
    seqs = p.text(pad.args[0])
    rest = p.text(pad)[len(p.text(pad.func)) + 1 + len(seqs):]
    return [replace(p, pad, f"pad_sequence([*{seqs}, torch.zeros({width}, dtype=torch.long)]"
                            f"{rest}[:-1]", change=True)]


@operator("tiny_batches", "resources", "performance_issue", "hyperparameter",
          "batch size 4: per-step overhead dominates")
def _tiny_batches(p: Program) -> list[Edit]:
    return _set_batch_size(p, "4")


@operator("dataset_cache_grows", "resources", "memory_issue", "data",
          "the dataset keeps 64 KB of every sample it makes (a cache that is never cleared)")
def _dataset_cache_grows(p: Program) -> list[Edit]:
    need(p.is_torch, "PyTorch only")
    classes = [c for c in ast.walk(p.tree) if isinstance(c, ast.ClassDef)]
    methods = {(c.name, f.name): f for c in classes for f in c.body
               if isinstance(f, ast.FunctionDef)}
    owner = need([c.name for c in classes if (c.name, "__getitem__") in methods
                  and (c.name, "__init__") in methods], "no dataset class")[0]
    init, get = methods[(owner, "__init__")], methods[(owner, "__getitem__")]
    return ensure_import(p, "torch") + [
        insert_after(p, init.body[-1], "self.made = []"),
        insert_before(p, get.body[0], "self.made.append(torch.ones(1 << 14))", change=True)]


@operator("oom_batch", "resources", "memory_issue", "hyperparameter",
          "from the 20th step on, a batch far beyond memory")
def _oom_batch(p: Program) -> list[Edit]:
    stmt, inp = model_input(p)
    loop = need(p.train_loop(), "no loop")
    need(p.loop_of(stmt) is loop, "model called outside the loop body")
    return _oom_edits(p, loop, stmt, inp)


def _oom_edits(p: Program, loop: ast.stmt, stmt: ast.stmt, inp: str) -> list[Edit]:
    """A step counter before the loop; the oversized batch made before the model call."""
    ind = p.indent(stmt)
    pos = p.line_start(stmt.lineno)
    head = f"{ind}seen_batches += 1\n{ind}if seen_batches >= 20:\n"
    make = f"{ind}    {inp} = {inp}.repeat(2 ** 34, *[1] * ({inp}.dim() - 1))\n"
    return [insert_before(p, outer_loop(p, loop), "seen_batches = 0"), Edit(pos, pos, head),
            Edit(pos, pos, make, change=True)]


@operator("memory_leak_cache", "resources", "memory_issue", "training_loop",
          "4 MB kept in a list every step (a cache that is never cleared)")
def _memory_leak_cache(p: Program) -> list[Edit]:
    need(p.is_torch, "PyTorch only")
    loop = need(p.train_loop(), "no loop")
    return ensure_import(p, "torch") + [
        insert_before(p, outer_loop(p, loop), "step_cache = []"),
        insert_before(p, loop.body[0], "step_cache.append(torch.ones(1 << 20))", change=True)]
