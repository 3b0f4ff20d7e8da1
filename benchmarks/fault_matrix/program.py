"""What a fault operator sees of a base program: its AST, and the training objects found in it.

Operators are written against these finders, never against a particular base: the optimizer
constructor, the training loss call, the model construction, the training data source, the
training loop and its ``zero_grad`` / ``backward`` / ``step`` statements, the Keras layers. A
finder returns ``None`` (or an empty list) where the program has no such thing, and the operator
then does not apply.

Conventions (the way people write training code, not a property of one base):

- the *training* loss call is the first call of a loss in a loop outside ``torch.no_grad()``;
- the *training* data source is the first ``TensorDataset(...)``, ``Dataset`` subclass
  instantiation, ``tf.data.Dataset.from_tensor_slices(...)`` or ``model.fit(...)`` in the file;
- the model is what the optimizer's ``.parameters()`` (PyTorch) or ``.trainable_variables`` /
  ``.compile`` (Keras) refers to.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

TORCH_OPTIMIZERS = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam",
                    "RAdam"}
TORCH_LOSS_FUNCTIONS = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
                        "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits"}
REGRESSION_LOSSES = {"MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "mse_loss", "l1_loss",
                     "smooth_l1_loss", "huber_loss", "MeanSquaredError", "MeanAbsoluteError",
                     "Huber", "mse", "mae", "mean_squared_error", "mean_absolute_error"}
LOGIT_LOSSES = {"CrossEntropyLoss", "cross_entropy", "BCEWithLogitsLoss",
                "binary_cross_entropy_with_logits", "NLLLoss", "nll_loss"}
KERAS_DATA = {"from_tensor_slices"}
SCHEDULERS = {"StepLR", "LambdaLR", "ExponentialLR", "MultiStepLR", "CosineAnnealingLR",
              "OneCycleLR", "LinearLR"}


def call_name(node: ast.AST) -> str | None:
    """The last name of a call's function (``torch.optim.Adam(...)`` -> ``"Adam"``)."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for an attribute chain of names, else ``""``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    """The keyword argument ``name`` of ``call``, if given."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


@dataclass
class Program:
    """A parsed base program with parent links and line offsets.

    Parameters
    ----------
    source : str
        The program text (ASCII, as the bases are).
    """

    source: str

    def __post_init__(self):
        self.tree = ast.parse(self.source)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.lines = self.source.splitlines(keepends=True)
        self._starts = [0]
        for line in self.lines:
            self._starts.append(self._starts[-1] + len(line))
        self.nodes = sorted((n for n in ast.walk(self.tree) if hasattr(n, "lineno")),
                            key=lambda n: (n.lineno, n.col_offset))

    # -- positions ------------------------------------------------------------------------
    def offset(self, lineno: int, col: int) -> int:
        """Absolute character offset of a 1-based line and a 0-based column."""
        return self._starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        """Start and end offsets of a node."""
        return (self.offset(node.lineno, node.col_offset),
                self.offset(node.end_lineno, node.end_col_offset))

    def text(self, node: ast.AST) -> str:
        """The source text of a node."""
        start, end = self.span(node)
        return self.source[start:end]

    def indent(self, stmt: ast.stmt) -> str:
        """The indentation of a statement's first line."""
        line = self.lines[stmt.lineno - 1]
        return line[:len(line) - len(line.lstrip())]

    def line_start(self, lineno: int) -> int:
        return self._starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """Offset just after the newline of ``lineno``."""
        return self._starts[lineno]

    # -- structure ------------------------------------------------------------------------
    def statement(self, node: ast.AST) -> ast.stmt:
        """The statement that contains ``node``."""
        while not isinstance(node, ast.stmt):
            node = self.parents[node]
        return node

    def ancestors(self, node: ast.AST):
        while node in self.parents:
            node = self.parents[node]
            yield node

    def in_no_grad(self, node: ast.AST) -> bool:
        """Inside ``with torch.no_grad()`` / ``torch.inference_mode()``."""
        for anc in self.ancestors(node):
            if isinstance(anc, ast.With):
                for item in anc.items:
                    if call_name(item.context_expr) in {"no_grad", "inference_mode"}:
                        return True
        return False

    def loop_of(self, node: ast.AST) -> ast.For | ast.While | None:
        """The innermost loop containing ``node`` (within its function)."""
        for anc in self.ancestors(node):
            if isinstance(anc, (ast.For, ast.While)):
                return anc
        return None

    def calls(self, name: str | set[str] | None = None) -> list[ast.Call]:
        """Calls in source order, optionally those whose last name is in ``name``."""
        names = {name} if isinstance(name, str) else name
        return [n for n in self.nodes if isinstance(n, ast.Call)
                and (names is None or call_name(n) in names)]

    def assignment_of(self, name: str, before: int | None = None) -> ast.Assign | None:
        """The last ``name = ...`` assignment (before line ``before`` when given)."""
        found = None
        for n in self.nodes:
            if isinstance(n, ast.Assign) and (before is None or n.lineno <= before):
                for t in n.targets:
                    if isinstance(t, ast.Name) and t.id == name:
                        found = n
        return found

    # -- framework ------------------------------------------------------------------------
    @functools.cached_property
    def framework(self) -> str:
        """``"torch"`` when the program imports torch, else ``"keras"``."""
        mods = set()
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Import):
                mods.update(a.name.split(".")[0] for a in n.names)
            elif isinstance(n, ast.ImportFrom) and n.module:
                mods.add(n.module.split(".")[0])
        return "torch" if "torch" in mods else "keras"

    @property
    def is_torch(self) -> bool:
        return self.framework == "torch"

    # -- training objects -----------------------------------------------------------------
    def optimizer(self) -> ast.Call | None:
        """The optimizer constructor call."""
        for c in self.calls():
            name = call_name(c)
            path = dotted(c.func)
            if self.is_torch and name in TORCH_OPTIMIZERS:
                return c
            if not self.is_torch and "optimizers" in path.split("."):
                return c
        return None

    def trainer_args(self) -> ast.Call | None:
        """Hugging Face's ``TrainingArguments(...)``: the optimizer's settings under its Trainer."""
        return next(iter(self.calls("TrainingArguments")), None)

    def optimizer_name(self) -> str | None:
        opt = self.optimizer()
        if opt is None:
            return None
        stmt = self.statement(opt)
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            return stmt.targets[0].id
        return None

    def model_name(self) -> str | None:
        """The variable holding the model."""
        if self.is_torch:
            opt = self.optimizer()
            if opt is not None and opt.args:
                arg = opt.args[0]
                if (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)
                        and arg.func.attr == "parameters" and isinstance(arg.func.value, ast.Name)):
                    return arg.func.value.id
            return None
        for n in self.nodes:
            if (isinstance(n, ast.Attribute) and n.attr in {"trainable_variables", "compile"}
                    and isinstance(n.value, ast.Name)):
                return n.value.id
        return None

    def model_assignment(self) -> ast.Assign | None:
        """The statement that constructs the model."""
        name = self.model_name()
        if name is None:
            return None
        opt = self.optimizer()
        return self.assignment_of(name, before=opt.lineno if opt is not None else None)

    @functools.cached_property
    def _loss_objects(self) -> dict[str, ast.Call]:
        return self._find_loss_objects()

    def loss_objects(self) -> dict[str, ast.Call]:
        """Names bound to a loss constructor (``criterion = nn.MSELoss()``)."""
        return self._loss_objects

    def _find_loss_objects(self) -> dict[str, ast.Call]:
        """Names bound to a loss constructor (``criterion = nn.MSELoss()``)."""
        found = {}
        for n in self.nodes:
            if (isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                    and isinstance(n.value, ast.Call)):
                name = call_name(n.value) or ""
                path = dotted(n.value.func)
                if name.endswith("Loss") or "losses" in path.split("."):
                    found[n.targets[0].id] = n.value
        return found

    def loss_kind(self, call: ast.Call) -> str | None:
        """The loss class or function name behind a loss call."""
        name = call_name(call)
        if name in TORCH_LOSS_FUNCTIONS:
            return name
        objects = self.loss_objects()
        if isinstance(call.func, ast.Name) and call.func.id in objects:
            return call_name(objects[call.func.id])
        return None

    def train_loss_call(self) -> ast.Call | None:
        """The first loss call in a loop (or a function) outside ``no_grad``."""
        for c in self.calls():
            if self.loss_kind(c) is None or self.in_no_grad(c) or len(c.args) < 2:
                continue
            in_fn = any(isinstance(a, ast.FunctionDef) for a in self.ancestors(c))
            if self.loop_of(c) is not None or in_fn:
                return c
        return None

    def loss_constructor(self) -> ast.Call | None:
        """The constructor of the training loss (a loss object, or Keras compile's ``loss=``)."""
        call = self.train_loss_call()
        objects = self.loss_objects()
        if call is not None and isinstance(call.func, ast.Name) and call.func.id in objects:
            return objects[call.func.id]
        return None

    def compile_call(self) -> ast.Call | None:
        calls = self.calls("compile")
        return calls[0] if calls else None

    def task_loss(self) -> str | None:
        """The training loss's name, whatever the framework (``"MSELoss"``, ``"mse"``...)."""
        call = self.train_loss_call()
        if call is not None:
            return self.loss_kind(call)
        comp = self.compile_call()
        if comp is not None:
            kw = keyword(comp, "loss")
            if kw is not None:
                if isinstance(kw.value, ast.Constant):
                    return str(kw.value.value)
                return call_name(kw.value)
        return None

    def is_regression(self) -> bool:
        return self.task_loss() in REGRESSION_LOSSES

    def is_classification(self) -> bool:
        loss = (self.task_loss() or "").lower()
        return any(k in loss for k in ("entropy", "nll"))

    def train_loop(self) -> ast.For | ast.While | None:
        """The innermost loop that runs the training step."""
        anchor = self.backward_stmt() or self.apply_gradients_stmt()
        if anchor is None:
            call = self.train_loss_call()
            anchor = call
        if anchor is None:
            return None
        loop = self.loop_of(anchor)
        if loop is None:  # a step function called from a loop
            fn = next((a for a in self.ancestors(anchor) if isinstance(a, ast.FunctionDef)), None)
            if fn is not None:
                for c in self.calls(fn.name):
                    loop = self.loop_of(c)
                    if loop is not None:
                        return loop
        return loop

    def _expr_stmt(self, attr: str, owner: str | None = None) -> ast.Expr | None:
        for n in self.nodes:
            if (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                    and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == attr):
                value = n.value.func.value
                if owner is None or (isinstance(value, ast.Name) and value.id == owner):
                    return n
        return None

    def zero_grad_stmt(self) -> ast.Expr | None:
        return self._expr_stmt("zero_grad", self.optimizer_name())

    def backward_stmt(self) -> ast.Expr | None:
        return self._expr_stmt("backward")

    def step_stmt(self) -> ast.Expr | None:
        return self._expr_stmt("step", self.optimizer_name())

    def apply_gradients_stmt(self) -> ast.Expr | None:
        return self._expr_stmt("apply_gradients", self.optimizer_name())

    def scheduler(self) -> ast.Call | None:
        calls = self.calls(SCHEDULERS)
        return calls[0] if calls else None

    def clip_call(self) -> ast.Call | None:
        calls = self.calls({"clip_grad_norm_", "clip_grad_value_"})
        return calls[0] if calls else None

    def dataset_classes(self) -> set[str]:
        """Names of classes in the file that subclass ``Dataset``."""
        return {n.name for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)
                and any(dotted(b).split(".")[-1] == "Dataset" for b in n.bases)}

    def data_source(self) -> tuple[ast.Call, ast.expr, ast.expr] | None:
        """The training data source: (the call, its inputs argument, its targets argument)."""
        classes = self.dataset_classes() | {"TensorDataset"}
        for c in self.calls():
            name = call_name(c)
            if name in classes and len(c.args) >= 2 and \
                    not any(isinstance(a, ast.Constant) for a in c.args[:2]):
                return c, c.args[0], c.args[1]  # Rows(480, 1): sizes and seeds, not data
            if name in KERAS_DATA and c.args and isinstance(c.args[0], ast.Tuple):
                elts = c.args[0].elts
                if len(elts) == 2:
                    return c, elts[0], elts[1]
            if name == "fit" and len(c.args) >= 2:
                return c, c.args[0], c.args[1]
        return None

    def named_data_source(self) -> tuple[ast.Call, str, str] | None:
        """The training data source when both its arguments are plain names."""
        found = self.data_source()
        if found is None:
            return None
        call, x, y = found
        if isinstance(x, ast.Name) and isinstance(y, ast.Name):
            return call, x.id, y.id
        return None

    def train_loader(self) -> ast.Call | None:
        """The ``DataLoader`` over the training data (the first one)."""
        calls = self.calls("DataLoader")
        return calls[0] if calls else None

    def dense_layers(self) -> list[ast.Call]:
        return self.calls("Dense")

    def forward_method(self) -> ast.FunctionDef | None:
        """The model class's ``forward`` (the one of the class the model is built from)."""
        assign = self.model_assignment()
        cls_name = call_name(assign.value) if assign is not None else None
        for n in ast.walk(self.tree):
            if isinstance(n, ast.ClassDef) and n.name == cls_name:
                for item in n.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "forward":
                        return item
        return None

    def val_model_call(self) -> ast.Call | None:
        """A call of the model on validation inputs (inside ``no_grad``)."""
        name = self.model_name()
        for c in self.calls(name):
            if isinstance(c.func, ast.Name) and self.in_no_grad(c) and c.args:
                return c
        return None

    def imports(self) -> set[str]:
        """``import X`` / ``import X as Y`` bound names."""
        out = set()
        for n in self.tree.body:
            if isinstance(n, ast.Import):
                out.update((a.asname or a.name.split(".")[0]) for a in n.names)
        return out
