"""Render Proof's Helm charts without the helm binary (not packaged for Debian; CI is air-gapped),
for the chart tests (tests/test_packaging_charts.py), which then check each object against the
Kubernetes JSON schema vendored by the kubernetes-validate package.

    python packaging/helm_render.py packaging/helm/proof-agent [--set ebpf.enabled=false]

It understands the subset of Go templates the charts use, and refuses anything else (an
unknown function, a missing value, an unclosed block), so a chart edit that leaves the subset
fails loudly here rather than rendering differently from helm:
- `{{ .Values.a.b }}`, `.Release.Name|Namespace|Service`, `.Chart.Name|Version|AppVersion`,
  string and integer literals, `.` (the root);
- `{{- … -}}` whitespace trimming; `{{/* comments */}}`;
- `if` / `else` / `end`, `define "name"` … `end`, `include "name" .`;
- pipelines into `quote`, `toYaml`, `toJson`, `nindent N`, `indent N`, `default X`.
Values print as Go does (`true`, `false`); a missing value is an error (helm would print
`<no value>`).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_ACTION = re.compile(r"\{\{(-?)(\s*)(.*?)(\s*)(-?)\}\}", re.DOTALL)


class RenderError(ValueError):
    """The chart leaves the supported subset, or a value it names is missing."""


@dataclass
class _Node:
    kind: str  # text, expr, if, define
    text: str = ""
    body: list[_Node] = field(default_factory=list)
    orelse: list[_Node] = field(default_factory=list)
    where: str = ""


def _tokens(source: str, where: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(source):
        text = source[pos : m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1) == "-":
            text = text.rstrip()
        out.append(("text", text))
        body = m.group(3)
        if not body.startswith("/*"):
            out.append(("action", body))
        elif not body.endswith("*/"):
            raise RenderError(f"{where}: unclosed comment")
        trim_next = m.group(5) == "-"
        pos = m.end()
    tail = source[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


def _parse(source: str, where: str) -> tuple[list[_Node], dict[str, list[_Node]]]:
    defines: dict[str, list[_Node]] = {}
    root: list[_Node] = []
    stack: list[tuple[_Node, list[_Node]]] = []  # (block, the list being filled)
    current = root
    for kind, value in _tokens(source, where):
        if kind == "text":
            if value:
                current.append(_Node("text", value))
            continue
        word = value.split(None, 1)[0] if value else ""
        if word == "if":
            node = _Node("if", value[2:].strip(), where=where)
            current.append(node)
            stack.append((node, current))
            current = node.body
        elif word == "else":
            if not stack or stack[-1][0].kind != "if":
                raise RenderError(f"{where}: else outside an if")
            current = stack[-1][0].orelse
        elif word == "define":
            name = _literal(value[6:].strip(), where)
            node = _Node("define", name, where=where)
            stack.append((node, current))
            current = node.body
        elif word == "end":
            if not stack:
                raise RenderError(f"{where}: end without a block")
            node, parent = stack.pop()
            current = parent
            if node.kind == "define":
                defines[node.text] = node.body
        elif word in ("range", "with", "template", "block"):
            raise RenderError(f"{where}: '{word}' is outside the supported subset")
        else:
            current.append(_Node("expr", value, where=where))
    if stack:
        raise RenderError(f"{where}: unclosed '{stack[-1][0].kind}'")
    return root, defines


def _literal(token: str, where: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] == '"':
        return str(json.loads(token))
    raise RenderError(f"{where}: expected a string literal, got {token!r}")


def go_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        raise RenderError(f"a map or list printed without toYaml/toJson: {value!r}")
    return str(value)


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and value != [] and value != {}


class Renderer:
    def __init__(self, context: dict[str, Any], defines: dict[str, list[_Node]]) -> None:
        self.context = context
        self.defines = defines

    def _term(self, term: str, where: str) -> Any:
        if term == ".":
            return self.context
        if term.startswith("."):
            value: Any = self.context
            for part in term[1:].split("."):
                if not isinstance(value, dict) or part not in value:
                    raise RenderError(f"{where}: {term} is not set")
                value = value[part]
            return value
        if term.startswith('"'):
            return _literal(term, where)
        if re.fullmatch(r"-?\d+", term):
            return int(term)
        if term in ("true", "false"):
            return term == "true"
        raise RenderError(f"{where}: cannot read {term!r}")

    def _call(self, name: str, args: list[Any], piped: list[Any], where: str) -> Any:
        args = args + piped  # a pipeline's value is the last argument
        if name == "quote" and len(args) == 1:
            return json.dumps(go_str(args[0]))
        if name == "toYaml" and len(args) == 1:
            return yaml.safe_dump(args[0], default_flow_style=False, sort_keys=True).rstrip("\n")
        if name == "toJson" and len(args) == 1:
            return json.dumps(args[0], separators=(",", ":"))
        if name in ("nindent", "indent") and len(args) == 2 and isinstance(args[0], int):
            pad = " " * args[0]
            text = "\n".join(pad + line for line in go_str(args[1]).split("\n"))
            return "\n" + text if name == "nindent" else text
        if name == "default" and len(args) == 2:
            return args[1] if truthy(args[1]) else args[0]
        if name == "include" and len(args) == 2 and isinstance(args[0], str):
            if args[0] not in self.defines:
                raise RenderError(f"{where}: include of undefined template {args[0]!r}")
            return Renderer(args[1], self.defines).render(self.defines[args[0]])
        raise RenderError(f"{where}: unsupported call {name}({len(args)} arguments)")

    def pipeline(self, text: str, where: str) -> Any:
        value: list[Any] = []
        for stage in (s.strip() for s in text.split("|")):
            try:
                words = shlex.split(stage, posix=False)
            except ValueError as exc:
                raise RenderError(f"{where}: {stage!r}: {exc}") from exc
            if not words:
                raise RenderError(f"{where}: empty pipeline stage in {text!r}")
            head, rest = words[0], words[1:]
            if head.startswith((".", '"')) or re.fullmatch(r"-?\d+", head):
                if rest or value:
                    raise RenderError(f"{where}: cannot apply {head!r} in {text!r}")
                value = [self._term(head, where)]
            else:
                value = [self._call(head, [self._term(a, where) for a in rest], value, where)]
        return value[0]

    def render(self, nodes: list[_Node]) -> str:
        out: list[str] = []
        for node in nodes:
            if node.kind == "text":
                out.append(node.text)
            elif node.kind == "expr":
                out.append(go_str(self.pipeline(node.text, node.where)))
            elif node.kind == "if":
                branch = node.body if truthy(self.pipeline(node.text, node.where)) else node.orelse
                out.append(self.render(branch))
        return "".join(out)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_set(items: list[str]) -> dict[str, Any]:
    """`a.b=value` overrides (YAML scalars: true, 3, text) → a nested dict."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise RenderError(f"--set {item!r}: expected key=value")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def render_chart(
    chart: str | Path,
    values: dict[str, Any] | None = None,
    *,
    release: str = "proof",
    namespace: str = "proof",
) -> dict[str, str]:
    """Template file name → rendered text, as `helm template` would give it."""
    chart = Path(chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    context = {
        "Values": _merge(defaults, values or {}),
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {
            "Name": meta["name"],
            "Version": meta["version"],
            "AppVersion": meta["appVersion"],
        },
    }
    defines: dict[str, list[_Node]] = {}
    parsed: dict[str, list[_Node]] = {}
    for path in sorted((chart / "templates").iterdir()):
        nodes, found = _parse(path.read_text(), path.name)
        defines.update(found)
        if not path.name.startswith("_"):
            parsed[path.name] = nodes
    renderer = Renderer(context, defines)
    return {name: renderer.render(nodes) for name, nodes in parsed.items()}


def render_objects(chart: str | Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's Kubernetes objects (every YAML document, empty ones left out)."""
    out: list[dict[str, Any]] = []
    for name, text in render_chart(chart, values).items():
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise RenderError(f"{name} does not render to YAML: {exc}") from exc
        out.extend(d for d in docs if d)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set" and i + 1 < len(argv)]
    try:
        rendered = render_chart(argv[0], parse_set(sets))
    except RenderError as exc:
        print(f"helm_render: {exc}", file=sys.stderr)
        return 1
    for name, text in rendered.items():
        print(f"---\n# Source: {name}\n{text.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
