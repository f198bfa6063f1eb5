"""Which code a completion and its prompt hold, for `code_tests` (see `code.py`): the completion's code
(its last fenced block, else its last Markdown indented block after prose, else all of it) and the prompt's
(fences that parse, indented blocks, unfenced runs of code): the helpers the tests use as the prompt's own
(`prompt_definitions`), the function asked for (`asked_function`), the body a completion continues
(`completed_code`) and HumanEval's uncalled `check(candidate)` (`with_check_call`)."""

from __future__ import annotations

import ast
import re

from grpokit.scoring.completions import to_text

_FENCE_RE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block, else the text after an unclosed final fence, else the last Markdown
    indented code block of a text that mixes prose and code ("Here it is:" then the code indented by
    four spaces; `indented_blocks`), else everything (a bare program, or HumanEval's indented body)."""
    blocks = _FENCE_RE.findall(completion)
    tail = completion.rsplit("```", 1)
    if completion.count("```") % 2 == 1 and "\n" in tail[1]:  # truncated inside a final block
        return tail[1].split("\n", 1)[1]
    if blocks:
        return blocks[-1]
    if not _parses(completion):
        indented = indented_blocks(completion)
        if indented:
            return indented[-1]
    return completion


def indented_blocks(text: str) -> list[str]:
    """Markdown's indented code blocks of `text` (CommonMark: after a blank line or at the start, lines
    indented by four spaces or a tab, blank lines inside), each without that indentation; [] when the
    text has no line of prose (no line that is neither blank nor indented): then it is code itself."""
    lines = text.split("\n")
    if not any(line.strip() and not line.startswith(("    ", "\t")) for line in lines):
        return []
    blocks, block, after_blank = [], None, True
    for line in lines:
        indented = line.startswith(("    ", "\t"))
        if block is not None and (indented or not line.strip()):
            block.append(line)
            continue
        if block is not None:
            blocks.append(block)
            block = None
        if indented and after_blank:
            block = [line]
        after_blank = not line.strip()
    if block is not None:
        blocks.append(block)
    out = []
    for block in blocks:
        while block and not block[-1].strip():
            block.pop()
        out.append("\n".join(b[1:] if b.startswith("\t") else b[4:] for b in block) + "\n")
    return out


def _prompt_texts(prompt: object) -> list[str]:
    """Each message of a chat prompt on its own (a system message does not hide the user's code)."""
    if isinstance(prompt, (list, tuple)) and any(isinstance(m, dict) for m in prompt):
        return [to_text(m) for m in prompt if isinstance(m, dict)]
    return [to_text(prompt)]


def prompt_sources(prompt: object) -> list[str]:
    """The Python code of a prompt, in any shape the data allows: a string or chat messages, and in each
    text its fenced blocks that parse (a usage example such as `>>> add(2, 3)` does not), its Markdown
    indented code blocks that parse, and every run of lines outside them that parses as Python and
    starts at a `def`, `class`, `import`, `from` or decorator line (instructions before or after the
    code are left out)."""
    sources = []
    for text in _prompt_texts(prompt):
        if "def " not in text and "import " not in text and "class " not in text:
            continue
        if _parses(text):  # code, not prose: its indented lines are its own
            sources.append(text)
            continue
        rest = _FENCE_RE.sub("\n", text)
        sources += [block for block in _FENCE_RE.findall(text) if _parses(block)]
        sources += [block for block in indented_blocks(rest) if _parses(block)]
        sources += [run for run in _code_runs(rest) if run.strip()]
    return sources


_CODE_START_RE = re.compile(r"(?:async\s+def|def|class|import|from\s+\S+\s+import)\b|@")


def _code_runs(text: str, max_lines: int = 400) -> list[str]:
    """The longest runs of lines of `text` that parse as Python, each starting at a line that opens
    code (`_CODE_START_RE`, not indented). The whole text when it parses."""
    if _parses(text):
        return [text]
    lines = text.split("\n")[:max_lines]
    runs, i = [], 0
    while i < len(lines):
        if not _CODE_START_RE.match(lines[i]):
            i += 1
            continue
        for end in range(len(lines), i, -1):
            chunk = "\n".join(lines[i:end])
            if _parses(chunk):
                runs.append(chunk)
                i = end
                break
        else:
            i += 1
    return runs


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def prompt_definitions(prompt: object, entry_point: str | None = None) -> str | None:
    """The source of the functions, classes and imports the prompt's Python code defines in full
    (HumanEval/32's `poly`, /38's `encode_cyclic`): the tests use these, never the candidate's. Left
    out: the function the candidate is asked for (`entry_point`, else the last function the prompt
    defines, HumanEval's layout, even when it is complete, as in "fix this function"), and stubs
    (a body of only a docstring, `pass` or `...`). The code is found by `prompt_sources`, whatever
    the prompt's shape (plain, fenced, after an instruction line, in a chat with a system message)."""
    nodes = []
    for source in prompt_sources(prompt):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        nodes += [(source, node) for node in tree.body]
    functions = [n for _, n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    asked = entry_point or (functions[-1].name if functions else None)
    kept = [
        ast.get_source_segment(source, node) or ""
        for source, node in nodes
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef))
        or (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name != asked
            and not _is_stub(node)
        )
    ]
    return "\n\n".join(k for k in kept if k) or None


def _defines(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
        for n in tree.body
    )


def asked_function(prompt: object, entry_point: str | None = None, code: str | None = None) -> str | None:
    """The function the candidate is asked for: `entry_point`, else the last one the prompt's code defines,
    else (given the candidate's `code`) the first function the prompt uses that the code defines: called
    in its examples (a fence or an indented block, `>>> add(2, 3)` too), then named in its text (`add`,
    add(a, b)). None when none of these names it."""
    if entry_point:
        return entry_point
    for source in reversed(prompt_sources(prompt)):
        try:
            functions = [
                n for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
        except (SyntaxError, ValueError):
            continue
        if functions:
            return functions[-1].name
    if code is None:
        return None
    try:
        defined = {
            n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
    except (SyntaxError, ValueError):
        return None
    return next((name for name in prompt_names(prompt) if name in defined), None)


_CALL_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\(")
_TICKED_RE = re.compile(r"`([A-Za-z_]\w*)(?:\([^`]*\))?`")


def prompt_names(prompt: object) -> list[str]:
    """Names of functions the prompt uses, in order: those its examples call (fenced or indented code,
    parsed or not: `>>> add(2, 3)`), then those its text calls or quotes (`add`, add(a, b))."""
    examples, prose = [], []
    for text in _prompt_texts(prompt):
        rest = _FENCE_RE.sub("\n", text)
        for block in _FENCE_RE.findall(text) + indented_blocks(rest):
            examples += _CALL_RE.findall(block)
        prose += _TICKED_RE.findall(rest) + _CALL_RE.findall(rest)
    return list(dict.fromkeys(examples + prose))


def completed_code(code: str, prompt: object, entry_point: str | None = None) -> str:
    """`code`, or the prompt's code followed by it when the completion continues the prompt (HumanEval's
    layout: the prompt ends with the signature and docstring of the asked function, `asked_function`,
    and the completion is its body). Only when `code` alone does not define that function, the prompt
    leaves it a stub (docstring, `pass` or `...` only) and the two together define it."""
    asked = asked_function(prompt, entry_point)
    if asked is None or _defines(code, asked):
        return code
    for source in reversed(prompt_sources(prompt)):
        try:
            stubs = [
                n
                for n in ast.parse(source).body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == asked
            ]
        except (SyntaxError, ValueError):
            continue
        if stubs:
            joined = source.rstrip() + "\n" + code
            return joined if _is_stub(stubs[-1]) and _defines(joined, asked) else code
    return code


_CHECK_CALL = re.compile(r"^check\s*\(", re.MULTILINE)


def with_check_call(tests: dict, entry_point: str | None) -> dict:
    """HumanEval's `test` column defines `check(candidate)` and leaves the call to the harness: the call
    `check(<entry_point>)` is added where the tests define `check` and never call it. Without an
    entry point such tests would pass whatever the candidate does: ValueError."""
    if tests["kind"] != "sources" or len(tests["cases"]) != 1:
        return tests
    source = tests["cases"][0]
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return tests
    defines_check = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
    if not defines_check or _CHECK_CALL.search(source):
        return tests
    if not entry_point or not entry_point.isidentifier():
        raise ValueError(
            "the tests define check(candidate) but never call it, and neither an entry_point column, the "
            "prompt's code nor a function the prompt names that the completion defines says which function "
            "to check: add an entry_point column (HumanEval's) or the call check(<function>) to the tests"
        )
    return {**tests, "cases": [f"{source.rstrip()}\n\n\ncheck({entry_point})\n"]}


def _is_stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return all(
        isinstance(n, ast.Pass) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        for n in fn.body
    )
