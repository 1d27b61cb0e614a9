"""What the architecture checks (layers.py, module-cycles.py, seam-words.py, file-sizes.py)
read of caw-box's Rust sources: every line of every file but comments and test code.

Test code is a test module: a `mod` item under `#[cfg(test)]` (other attributes and a
visibility may stand between them), either inline (`mod tests { ... }`, its body found by
matching braces, so braces in strings, chars and comments do not count) or a file of its
own (`mod tests;` names the file, and every module under it is test code too). Reading goes
on after a test module: code that follows one is read like any other. A `#[cfg(test)]` on
anything else (a `use`, a helper `fn`) is code like any other.

Blanked text keeps every newline and the length of what it blanks, so an offset or a line
number in it is one in the file.

Not here: what each check looks for in that code (its own script)."""
import os
import re

_CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
_ATTRIBUTE = re.compile(r"\s*#\s*\[")
_MOD = re.compile(r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?mod\s+(\w+)\s*([{;])")
_PATH_ATTR = re.compile(r'#\s*\[\s*path\s*=\s*"([^"]*)"\s*\]')


def blank(text, strings=False):
    """`text` with every comment (line, block, nested block, doc) blanked; with `strings`,
    the insides of string, raw string and char literals too (their quotes stay)."""
    out = []
    i, n = 0, len(text)

    def keep_or_blank(s):
        if not strings:
            return s
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        else:
            raw = re.match(r'b?r(#*)"', text[i:i + 300])
            if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                end = '"' + raw.group(1)
                j = text.find(end, i + raw.end())
                j = n if j < 0 else j + len(end)
                body_from, body_to = i + raw.end(), max(i + raw.end(), j - len(end))
                out.append(text[i:body_from] + keep_or_blank(text[body_from:body_to]) + text[body_to:j])
                i = j
            elif c == '"':
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                out.append('"' + keep_or_blank(text[i + 1 : j]) + text[j : j + 1])
                i = j + 1
            elif c == "'":
                # A char literal ('x', '\n', '\u{..}'), else a lifetime.
                lit = re.match(r"'(?:\\.[^']*|[^'\\])'", text[i:i + 16])
                if lit:
                    out.append("'" + keep_or_blank(text[i + 1 : i + lit.end() - 1]) + "'")
                    i += lit.end()
                else:
                    out.append(c)
                    i += 1
            else:
                out.append(c)
                i += 1
    return "".join(out)


def test_modules(text):
    """The test modules of a file's text: (start, end, name, path attribute or None, inline)
    for each, `text[start:end]` running from its `#[cfg(test)]` to its closing `}` or `;`."""
    code = blank(text, strings=True)
    found = []
    pos = 0
    while True:
        cfg = _CFG_TEST.search(code, pos)
        if not cfg:
            return found
        j = cfg.end()
        path = None
        while True:  # further attributes: `#[allow(..)]`, `#[path = ".."]` ...
            attr = _ATTRIBUTE.match(code, j)
            if not attr:
                break
            k, depth = attr.end(), 1
            while k < len(code) and depth:
                depth += {"[": 1, "]": -1}.get(code[k], 0)
                k += 1
            given = _PATH_ATTR.fullmatch(text[code.index("#", j) : k])
            if given:
                path = given.group(1)
            j = k
        item = _MOD.match(code, j)
        if not item:
            pos = cfg.end()
            continue
        if item.group(2) == ";":
            found.append((cfg.start(), item.end(), item.group(1), path, False))
            pos = item.end()
            continue
        k, depth = item.end(), 1
        while k < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[k], 0)
            k += 1
        found.append((cfg.start(), k, item.group(1), path, True))
        pos = k


def without_tests(text, strings=False):
    """`text` blanked (see `blank`), and every test module in it blanked too."""
    out = blank(text, strings)
    for start, end, _, _, _ in test_modules(text):
        out = out[:start] + "".join(c if c == "\n" else " " for c in out[start:end]) + out[end:]
    return out


class Tree:
    """The modules of a crate's source folder: each .rs file under `root` by its module path
    (`src/provider/mod.rs` is ("provider",), `src/provider/codex.rs` ("provider", "codex"),
    `src/lib.rs` ("lib",), `src/main.rs` ("main",)); those that are test modules set apart."""

    def __init__(self, root):
        self.root = root
        self.mods = {}  # module path -> file
        for dp, _, fs in os.walk(root):
            for f in fs:
                if not f.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(dp, f), root)[:-3].split(os.sep)
                if rel[-1] == "mod":
                    rel = rel[:-1]
                self.mods[tuple(rel)] = os.path.normpath(os.path.join(dp, f))
        self.files = {f: m for m, f in self.mods.items()}
        self._text = {}
        # Test modules of their own: `#[cfg(test)] mod x;` in a file names x's file.
        self.test_roots = set()
        for m, f in self.mods.items():
            for _, _, name, path, inline in test_modules(self.text(f)):
                if inline:
                    continue
                if path is not None:  # `#[path]`: relative to the declaring file's folder
                    file = os.path.normpath(os.path.join(os.path.dirname(f), path))
                    if file in self.files:
                        self.test_roots.add(self.files[file])
                    continue
                self.test_roots.add(self.scope(m) + (name,))

    @staticmethod
    def scope(m):
        """The module path a file's own items live under (lib.rs and main.rs: the crate's)."""
        return () if m in (("lib",), ("main",)) else m

    def text(self, f):
        if f not in self._text:
            self._text[f] = open(f, encoding="utf-8").read()
        return self._text[f]

    def is_test(self, m):
        return any(m[: len(t)] == t for t in self.test_roots)

    def production(self):
        """(module path, file) of every file that is not a test module, sorted."""
        return sorted((m, f) for m, f in self.mods.items() if not self.is_test(m))

    def code(self, f, strings=False):
        """A file's code without comments or test modules (see `without_tests`)."""
        return without_tests(self.text(f), strings)

    def resolve(self, path):
        """The module a path names: its longest prefix that is a module with a file."""
        for n in range(len(path), 0, -1):
            if tuple(path[:n]) in self.mods:
                return tuple(path[:n])
        return None

    def imports(self, m, f):
        """What module `m` (file `f`) refers to: (line, target module path) for each path into
        the crate in its code (`crate::`, `super::`, `self::`, a child module's name, and each
        path of a `use` tree), outside strings, comments and test modules. A `lib.rs`/`main.rs`
        is the crate's root; `super` of a file's module is its parent (in an inline module too:
        caw-box has none that imports)."""
        code = self.code(f, strings=True)
        scope = self.scope(m)
        children = {c[len(scope)] for c in self.mods if len(c) == len(scope) + 1 and c[: len(scope)] == scope}
        found = []

        def path_to(parts):
            """The module path `parts` (crate::/super::/self::/child…) names, else None."""
            parts = [p for p in parts if p]
            if not parts:
                return None
            if parts[0] in ("crate", "$crate"):
                base, rest = [], parts[1:]
            elif parts[0] in ("super", "self"):
                base = list(scope)
                rest = parts
                while rest and rest[0] in ("super", "self"):
                    if rest[0] == "super":
                        base = base[:-1]
                    rest = rest[1:]
            elif parts[0] in children:
                base, rest = list(scope), parts
            else:
                return None
            return self.resolve(base + rest)

        def at(offset):
            return code.count("\n", 0, offset) + 1

        uses = []
        for use in re.finditer(r"\buse\s+([^;]*);", code):
            uses.append((use.start(), use.end()))
            for parts in expand_use(use.group(1)):
                target = path_to(parts)
                if target:
                    found.append((at(use.start()), target))
        inside_use = lambda o: any(s <= o < e for s, e in uses)  # noqa: E731
        for cap in re.finditer(r"(?<![\w:$])(\$?\w+)((?:\s*::\s*\w+)+)", code):
            if inside_use(cap.start()):
                continue
            parts = [cap.group(1)] + [p.strip() for p in cap.group(2).split("::")]
            target = path_to(parts)
            if target:
                found.append((at(cap.start()), target))
        return found


def expand_use(tree):
    """The paths of a `use` tree (`crate::{a::{self, B}, c as d, e::*}`) as lists of names:
    [crate, a], [crate, a, B], [crate, c], [crate, e]."""
    tokens = re.findall(r"\$?\w+|::|[{},*]", tree)
    pos = [0]

    def parse(prefix):
        paths = []
        path = list(prefix)
        while pos[0] < len(tokens):
            t = tokens[pos[0]]
            pos[0] += 1
            if t == "::":
                continue
            if t == "{":
                while pos[0] < len(tokens) and tokens[pos[0]] != "}":
                    if tokens[pos[0]] == ",":
                        pos[0] += 1
                        continue
                    paths += parse(path)
                pos[0] += 1
                return paths
            if t in (",", "}"):
                pos[0] -= 1
                break
            if t == "*":
                continue
            if t == "as":
                pos[0] += 1  # the alias
                continue
            if t == "self":
                continue
            path.append(t)
        if len(path) > len(prefix) or not paths:
            paths.append(path)
        return paths

    out = []
    while pos[0] < len(tokens):
        if tokens[pos[0]] == ",":
            pos[0] += 1
            continue
        before = pos[0]
        out += parse([])
        if pos[0] == before:
            pos[0] += 1
    return out
