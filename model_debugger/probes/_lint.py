"""Shared access to the static lint for probes: the pitfall pack of the framework the code uses,
run once per context, filtered by rule."""

from __future__ import annotations

from .base import ProbeContext


def lint_hits(ctx: ProbeContext, rule: str) -> list:
    """Lint hits of one rule over the context's source files (computed once, cached).

    Each file is linted by the pack of the framework it imports (PyTorch or Keras).
    """
    if "lint" not in ctx.extras:
        from ..pitfalls import keras_lint, torch_lint
        from ..pitfalls.detect import framework_of_source

        packs = {"torch": torch_lint, "keras": keras_lint}
        names = [e["name"] for e in ctx.run.of("model") if e.get("name")]
        hits = []
        for path, text in ctx.source_files.items():
            pack = packs.get(framework_of_source(text))
            if pack is not None:
                hits += pack.lint_source(text, path, names)
        ctx.extras["lint"] = hits
    return [h for h in ctx.extras["lint"] if h.rule == rule]


def loc(hit) -> dict:
    return {"file": hit.file, "line": hit.line}
