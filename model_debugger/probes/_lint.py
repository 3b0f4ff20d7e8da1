"""Shared access to the static lint for probes: run once per context, filter by rule."""

from __future__ import annotations

from .base import ProbeContext


def lint_hits(ctx: ProbeContext, rule: str) -> list:
    """Lint hits of one rule over the context's source files (computed once, cached)."""
    if "lint" not in ctx.extras:
        hits = []
        if ctx.framework in ("torch", "none") and ctx.source_files:
            from ..pitfalls.torch_lint import lint_source

            names = [e["name"] for e in ctx.run.of("model") if e.get("name")]
            for path, text in ctx.source_files.items():
                hits += lint_source(text, path, names)
        ctx.extras["lint"] = hits
    return [h for h in ctx.extras["lint"] if h.rule == rule]


def loc(hit) -> dict:
    return {"file": hit.file, "line": hit.line}
