"""Redaction of secrets: one pass shared by every writer of a session folder and every export.

Secrets are removed when they are recorded (the session's copy of the script, the run record's
``start`` and ``error`` events, session events, fix copies), so nothing written under
``.model_debugger/`` holds them and a later export or ``report --json`` cannot leak them, even
in a process that no longer has the environment the run had. Redaction never executes or
evaluates what it reads.

What is redacted (each replaced by :data:`REDACTED`):

- values of environment variables whose names look secret (``*_TOKEN``, ``*_SECRET``,
  ``*_PASSWORD``, ``*_API_KEY``, ``DB_PASS``...), remembered from the moment a run or a
  session starts (:func:`remember_environment`), so an export after the variable is unset
  still redacts;
- known token formats (Hugging Face, OpenAI/Anthropic, GitHub, GitLab, Slack, Stripe, Google
  API keys, AWS access key ids, JWTs), AWS secret access keys (40 characters of base64 near ``aws``/an access key id),
  private-key blocks (whole or truncated);
- ``Bearer``/``Basic`` credentials, ``Authorization:`` and ``Cookie:`` headers, passwords in
  URLs (``scheme://user:password@host``, an empty user, an ``@`` inside the password);
- key/value forms whose key names a secret (``password=...``, ``db_pass = "..."``,
  ``"apiKey": "..."``, ``--api-key VALUE``) and free text such as ``password is hunter2``,
  ``the password is: hunter2!``, ``password hunter2!`` (a bare value with a digit or symbol).

Code that only reads a secret is kept: ``args.token``, ``os.environ["TOKEN"]``,
``getpass.getpass()``, and names that are not secrets (``tokenizer``, ``max_tokens``,
``num_keys``, ``keyboard``, tokenizer special tokens such as ``pad_token``/``eos_token``). No
value is a secret that is a format template (``"token: %s"``, ``{}``, ``{pw!r}``) or a
vocabulary token (``<|endoftext|>``, ``</s>``, ``[PAD]``): such values are never redacted nor
remembered.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize

__all__ = ["REDACTED", "is_secret_name", "read_source", "redact", "redact_args", "redact_code",
           "redact_log", "redact_value", "remember_environment", "remember_script",
           "write_private"]

REDACTED = "[REDACTED]"

# -- names ------------------------------------------------------------------------------------
_SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "pwd", "pw", "pass", "secret", "token", "apikey",
    "credential", "credentials", "auth", "authorization", "cookie", "privatekey"})
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token", "apikey",
                    "accesskey", "secretkey", "privatekey")
_KEY_QUALIFIERS = frozenset({
    "api", "access", "secret", "private", "signing", "encryption", "master", "license",
    "client", "account", "auth", "subscription", "service", "storage", "app", "session"})
_NOT_SECRET_ENV = frozenset({"PWD", "OLDPWD"})
# tokenizer special tokens (``pad_token = "[PAD]"``, ``eos_token="</s>"``): vocabulary, no secret
_SPECIAL_TOKEN_WORDS = frozenset({
    "pad", "bos", "eos", "unk", "sep", "cls", "mask", "special", "start", "end", "sos", "eot",
    "eod", "begin", "stop"})
_PATH_WORDS = frozenset({"sock", "socket", "file", "path", "dir", "home"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|PASS|PWD|PW|CREDENTIAL|AUTH|COOKIE",
                         re.I)
"""A quick pre-filter: names that :func:`is_secret_name` may accept contain one of these."""


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(name)]


def is_secret_name(name: str, environment: bool = False) -> bool:
    """Whether ``name`` (a variable, key, flag or environment variable) names a secret.

    Parameters
    ----------
    name : str
        ``db_pass``, ``apiKey``, ``--api-key``, ``AWS_SECRET_ACCESS_KEY``...
    environment : bool
        An environment variable: any secret word counts (``GITHUB_TOKEN_FOR_CI``), and a bare
        ``KEY`` word too (``GPG_KEY``); ``PWD``/``OLDPWD`` and socket/file/path variables
        (``SSH_AUTH_SOCK``) do not.

    Returns
    -------
    bool
        True for ``password``, ``db_pass``, ``auth_token``, ``client_secret``, ``api_key``,
        ``aws_secret_access_key``; False for ``tokenizer``, ``max_tokens``, ``num_keys``,
        ``keyboard``, ``token_count``, ``key``.
    """
    if not SECRET_NAME.search(name):
        return False
    words = _words(name)
    if not words:
        return False
    if environment:
        if name in _NOT_SECRET_ENV or _PATH_WORDS.intersection(words):
            return False
        return any(w in _SECRET_WORDS or w == "key" or w.endswith(_SECRET_SUFFIXES)
                   for w in words)
    last = words[-1]
    if last == "token" and len(words) > 1 and words[-2] in _SPECIAL_TOKEN_WORDS:
        return False
    if last in _SECRET_WORDS or (last.endswith(_SECRET_SUFFIXES) and last != "secrets"):
        return True
    return last == "key" and len(words) > 1 and words[-2] in _KEY_QUALIFIERS


# -- the environment the run had --------------------------------------------------------------
_remembered: set[str] = set()


def _worth_remembering(value: str) -> bool:
    """A value long and specific enough to be replaced wherever it appears."""
    value = value.strip()
    return not (len(value) < 6 or value.isdigit() or REDACTED in value or _not_a_value(value)
                or value.lower() in ("true", "false", "yes", "no", "none", "null")
                or os.path.exists(value))  # paths (XAUTHORITY, a credentials file)


_env_checked: dict[tuple[str, str], bool] = {}


def _env_secret(name: str, value: str) -> bool:
    """Whether an environment variable holds a secret (cached: redact runs for every string)."""
    known = _env_checked.get((name, value))
    if known is None:
        known = is_secret_name(name, environment=True) and _worth_remembering(value)
        if len(_env_checked) < 4096:
            _env_checked[(name, value)] = known
    return known


def remember_environment(environ=None) -> int:
    """Remember the secret-looking environment values of this process (of a run's start).

    They stay redacted in this process after the variable is unset. The recorder calls this
    when a run starts and :meth:`DebugSession.create` when a session starts.

    Returns
    -------
    int
        How many values are remembered.
    """
    env = os.environ if environ is None else environ
    _remembered.update(v.strip() for k, v in env.items() if _env_secret(k, v))
    return len(_remembered)


def _secret_values() -> list[str]:
    values = set(_remembered)
    values.update(v.strip() for k, v in os.environ.items() if _env_secret(k, v))
    return sorted(values, key=len, reverse=True)


# -- patterns ---------------------------------------------------------------------------------
_B64 = r"A-Za-z0-9+/="
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
    r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----", re.S)
_PRIVATE_KEY_CUT = re.compile(  # a block cut short (a message truncated, a partial print)
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?:[" + _B64 + r"\s:-]|\\[nr])*")
_PRIVATE_KEY_TAIL = re.compile(  # the end of a block whose start was cut off
    r"(?:[" + _B64 + r"]{16,}(?:\s|\\[nr])+)+-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_TOKENS = [
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),  # Stripe secret/restricted keys
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),  # Google API keys
]
_AWS_NEAR = re.compile(r"(?i)aws|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|" + re.escape(REDACTED))
_B64_40 = re.compile(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])")
_BEARER = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]{8,})")
_AUTH_HEADER = re.compile(
    r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic|token|digest)(\s+))?"
    r"([^\s\"',;]+)")
# user may be empty (redis://:pw@host); the password runs to the last @ before the path
_URL_CRED = re.compile(r"(://[^/\s:@\"']*:)([^/\s\"']+)@")
_COOKIE = re.compile(r"(?i)(\b(?:set-)?cookie[\"']?\s*[:=]\s*[\"']?)([^\r\n\"']*=[^\r\n\"']*)")
_KEYVAL = re.compile(  # the value in a lookahead: a key that is no secret consumes nothing more
    r"(?<![\w.])([A-Za-z_][\w.-]*)([\"']?\s*[=:]\s*)"
    r"(?=([\"'])(.*?)\3|([^\s\"',;&()\[\]{}<>\\]+))")
_FREE_TEXT = re.compile(
    r"(?i)\b(password|passwd|passphrase|pwd|secret|token|api[ _-]?key|access[ _-]?key)"
    r"((?:\s+(?:is|was|of|for\s+\S+\s+is))?[ \t]*:?[ \t]+)([\"']?)([^\s\"']+)\3")
# a format placeholder (%s, %(name)s, %-10d, {}, {name!r}): a template the value goes into
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa]")
# markup-like vocabulary tokens: <|endoftext|>, </s>, <mask>, [PAD], [CLS]
_MARKUP = re.compile(r"(?:<[^<>\s]{1,40}>|\[[^\[\]\s]{1,40}\])+")
# words a secret-named setting holds that are no secret: auth="none", auth_type: "bearer"
_NOT_SECRET_WORDS = frozenset({
    "none", "null", "nil", "true", "false", "yes", "no", "on", "off", "auto", "default",
    "basic", "bearer", "digest", "token", "oauth", "oauth2", "jwt", "ntlm", "kerberos",
    "negotiate", "anonymous", "disabled", "enabled", "required", "optional", "env",
    "environment", "header", "headers", "query", "cookie", "cookies"})


def _templated(value: str) -> bool:
    """Whether ``value`` holds a format placeholder (``%s``, ``{}``, ``{name}``)."""
    return "{" in value or "}" in value or bool(_PERCENT.search(value))


def _not_a_value(value: str) -> bool:
    """A template or a vocabulary token (``%s``, ``{}``, ``<|endoftext|>``, ``[PAD]``)."""
    return _templated(value) or bool(_MARKUP.fullmatch(value.strip()))


def _secret_literal(name: str, value) -> bool:
    """Whether a literal assigned to the secret name ``name`` holds a secret value.

    Not a template (``"token: %s"``), a vocabulary token (``"<|endoftext|>"``), a message or
    prompt (``"Enter the password:"``), a setting word (``auth = "none"``) or the name itself.
    """
    if not isinstance(value, str) or not value.strip() or REDACTED in value:
        return False
    v = value.strip()
    if _not_a_value(v) or v.lower() in _NOT_SECRET_WORDS or v.lower() == name.lower():
        return False
    return not (any(c.isspace() for c in v) and v.endswith((":", "?", "...")))


_CODE_VALUES = frozenset({"None", "True", "False", "null", "true", "false", "none", "nil",
                          REDACTED})


def _aws_secrets(text: str) -> str:
    """40-character base64 strings near ``aws`` or an access key id: AWS secret access keys."""
    def one(m: re.Match) -> str:
        value = m.group(0)
        mixed = (any(c.isupper() for c in value) and any(c.islower() for c in value)
                 and any(c.isdigit() or c in "+/" for c in value))
        if not mixed:
            return value
        window = text[max(0, m.start() - 120):m.start()]
        return REDACTED if _AWS_NEAR.search(window) else value

    return _B64_40.sub(one, text)


def _keyval(m: re.Match) -> tuple[int, str] | None:
    """``(end, replacement)`` for a secret key's value, or None to keep the text."""
    name, sep = m.group(1), m.group(2)
    if not is_secret_name(name.rsplit(".", 1)[-1] if "." in name else name):
        return None
    if m.group(3):  # quoted literal: keep the quotes
        inner = m.group(4)
        if not inner or inner == REDACTED or _not_a_value(inner):
            return None
        end = m.end() + len(inner) + 2
        return end, f"{name}{sep}{m.group(3)}{REDACTED}{m.group(3)}"
    value = m.group(5)
    end = m.end() + len(value)
    after = m.string[end:end + 1]
    dotted = "." in value and all(p.isidentifier() for p in value.split("."))
    same = value.lower().replace("-", "_") in (name.lower().replace("-", "_"),
                                                 *_words(name))
    scheme = value.lower() in ("bearer", "basic", "token", "digest")  # Authorization: Bearer x
    if (after in ("(", "[") or dotted or value in _CODE_VALUES or same or scheme
            or _not_a_value(value)):
        return None  # code reading the secret (os.environ[...], args.token), not a secret
    return end, f"{name}{sep}{REDACTED}"


def _keyvals(text: str) -> str:
    out, last = [], 0
    for m in _KEYVAL.finditer(text):
        if m.start() < last:
            continue
        found = _keyval(m)
        if found is not None:
            out.append(text[last:m.start()])
            out.append(found[1])
            last = found[0]
    out.append(text[last:])
    return "".join(out)


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _free_text(m: re.Match) -> str:
    value = m.group(4).rstrip(".,;:!?)")
    looks_secret = len(value) >= 6 and any(not c.isalpha() for c in value)
    if not looks_secret or value == REDACTED or _not_a_value(value):
        return m.group(0)
    if not m.group(2).strip() and not m.group(3) and (
            value.startswith(("/", "~", "./", "../")) or _number(value)):
        return m.group(0)  # bare "token 50256", "pwd /home/alice": an id, a path
    rest = m.group(4)[len(value):]
    return f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}{m.group(3)}{rest}"


def redact(text: str) -> str:
    """Replace the secrets in ``text`` with ``[REDACTED]``.

    Parameters
    ----------
    text : str
        Any recorded text: a message, a traceback, printed output, an argument, code.

    Returns
    -------
    str
        The text with every secret form listed in the module docstring replaced. Idempotent.
    """
    if not text or not isinstance(text, str):
        return text
    for value in _secret_values():
        if value in text:
            text = text.replace(value, REDACTED)
    if "PRIVATE KEY" in text:  # the block patterns backtrack: only where a block can be
        text = _PRIVATE_KEY.sub(REDACTED, text)
        text = _PRIVATE_KEY_CUT.sub(REDACTED, text)
        text = _PRIVATE_KEY_TAIL.sub(REDACTED, text)
    for pattern in _TOKENS:
        text = pattern.sub(REDACTED, text)
    text = _aws_secrets(text)
    text = _BEARER.sub(lambda m: (f"{m.group(1)}{m.group(2)}{REDACTED}"
                                  if re.search(r"[\d._~+/=-]", m.group(3)) else m.group(0)),
                       text)
    text = _AUTH_HEADER.sub(lambda m: m.group(0) if m.group(4) == REDACTED
                            or m.group(4).lower() in ("bearer", "basic", "token", "digest")
                            or _not_a_value(m.group(4)) else
                            f"{m.group(1)}{m.group(2) or ''}{m.group(3) or ''}{REDACTED}", text)
    text = _URL_CRED.sub(lambda m: m.group(0) if _templated(m.group(2)) else
                         f"{m.group(1)}{REDACTED}@", text)
    if "ookie" in text or "OOKIE" in text:
        text = _COOKIE.sub(lambda m: m.group(0) if _templated(m.group(2))
                           or m.group(2).strip() == REDACTED else
                           f"{m.group(1)}{REDACTED}", text)
    text = _keyvals(text)
    return _FREE_TEXT.sub(_free_text, text)


def redact_args(args: list[str]) -> list[str]:
    """Redact command-line arguments, including the value after a ``--token``-like flag.

    Parameters
    ----------
    args : list of str
        ``["--epochs", "3", "--api-key", "VALUE", "--password=VALUE"]``.

    Returns
    -------
    list of str
        ``["--epochs", "3", "--api-key", "[REDACTED]", "--password=[REDACTED]"]``. The hidden
        values are remembered (as secret environment values are) and redacted wherever this
        process writes them later: in the exception that quotes the key, in a printed line.
    """
    out = []
    for i, arg in enumerate(args):
        arg = str(arg)
        prev = str(args[i - 1]) if i else ""
        secret_flag = (prev.startswith("-") and "=" not in prev
                       and is_secret_name(prev.lstrip("-")))
        if secret_flag and not arg.startswith("-"):
            value = arg
        elif arg.startswith("-") and "=" in arg and is_secret_name(arg.split("=")[0].lstrip("-")):
            value = arg.split("=", 1)[1]
        else:
            value = None
        if value is not None and _worth_remembering(value):
            _remembered.add(value.strip())  # the run's own secret: redacted wherever it shows
        out.append(REDACTED if value is not None and value == arg else redact(arg))
    return out


# -- Python source ----------------------------------------------------------------------------
_STRING_PREFIX = re.compile(r"^([A-Za-z]*)(\"\"\"|'''|\"|')")


def _literal(token: str) -> str:
    """A string literal token with its content replaced, prefix and quotes kept.

    The value is remembered: a message that quotes it later (``f"... {db_pass}"``) is redacted
    too.
    """
    m = _STRING_PREFIX.match(token)
    if not m or "f" in m.group(1).lower():
        return redact(token)
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = None
    for v in (value, token[m.end():len(token) - len(m.group(2))]):
        specific = isinstance(v, str) and (len(v) >= 12 or any(not c.isalpha() for c in v))
        if specific and _worth_remembering(v):  # not a word such as "password" or "none"
            _remembered.add(v.strip())
    return f"{m.group(1)}{m.group(2)}{REDACTED}{m.group(2)}"


def _secret_target(sig: list[tokenize.TokenInfo]) -> str | None:
    """The secret name a string is assigned to or passed as, from the tokens before it.

    ``secret_name =``/``:``, ``"secret_name":``, ``["secret_name"] =``; None otherwise.
    """
    if len(sig) < 2 or sig[-1].string not in ("=", ":"):
        return None
    target, name = sig[-2], None
    if target.type == tokenize.NAME:
        name = target.string
    elif target.type == tokenize.STRING:
        m = _STRING_PREFIX.match(target.string)
        name = target.string[m.end():-len(m.group(2))] if m else ""
    elif target.string == "]" and len(sig) >= 4 and sig[-3].type == tokenize.STRING:
        m = _STRING_PREFIX.match(sig[-3].string)
        name = sig[-3].string[m.end():-len(m.group(2))] if m else ""
    return name if name and is_secret_name(name) else None


def _literal_value(token: str) -> str:
    """The value of a string literal token (its raw content where it does not evaluate)."""
    m = _STRING_PREFIX.match(token)
    if not m:
        return token
    if "f" not in m.group(1).lower():
        try:
            value = ast.literal_eval(token)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if isinstance(value, str):
            return value
    return token[m.end():len(token) - len(m.group(2))]


def redact_code(source: str) -> str:
    """Redact Python source so that it still runs: only string literals and comments change.

    A literal assigned to or passed as a secret name (``db_pass = "..."``,
    ``connect(password="...")``, ``{"api_key": "..."}``, ``cfg["token"] = "..."``) becomes
    ``"[REDACTED]"`` when it holds a secret value: not a template (``"%s"``, ``"{}"``), a
    vocabulary token (``"<|endoftext|>"``, ``"[PAD]"``), a prompt (``"Enter the password:"``)
    or a setting word (``auth = "none"``); every other literal and comment goes through
    :func:`redact`, which only replaces secret values (a token format, a URL password), never a
    template's placeholder. So a script without a secret is copied unchanged and runs exactly
    as the original (``"token: %s" % token`` is kept). Code that reads a secret
    (``token = os.environ["TOKEN"]``, ``token = tok``) is left alone. Source that does not
    tokenize is redacted as text.

    Parameters
    ----------
    source : str
        A script or a notebook cell.

    Returns
    -------
    str
        The redacted source.
    """
    if not source:
        return source
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, ValueError):
        return redact(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1] if pos[0] - 1 < len(starts) else len(source)

    out, last = [], 0
    sig: list[tokenize.TokenInfo] = []
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT)
    fstring_start = getattr(tokenize, "FSTRING_START", None)
    depth, fs_begin = 0, 0
    for tok in tokens:
        if fstring_start is not None and tok.type == fstring_start:
            if depth == 0:
                fs_begin = offset(tok.start)
            depth += 1
            continue
        if depth:
            if tok.type == getattr(tokenize, "FSTRING_END", None):
                depth -= 1
                if depth == 0:
                    end = offset(tok.end)
                    out.append(source[last:fs_begin])
                    out.append(redact(source[fs_begin:end]))
                    last = end
            continue
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            begin, end = offset(tok.start), offset(tok.end)
            text = source[begin:end]
            target = _secret_target(sig) if tok.type == tokenize.STRING else None
            if target and _secret_literal(target, _literal_value(text)):
                new = _literal(text)
            else:
                new = redact(text)
            out.append(source[last:begin])
            out.append(new)
            last = end
        if tok.type not in skip:
            sig = (sig + [tok])[-4:]
    out.append(source[last:])
    return "".join(out)


def remember_script(path: str) -> None:
    """Remember the literals a script assigns to secret names (``db_pass = "..."``).

    The recorder calls this with ``sys.argv[0]`` when a run starts, so that an exception or a
    printed line quoting such a value is redacted in the record. Anything that is not a readable
    Python file under 4 MB is ignored.
    """
    try:
        if not path.endswith(".py") or os.path.getsize(path) > 4 << 20:
            return
        redact_code(read_source(path))
    except (OSError, ValueError):
        return


# -- recorded payloads ------------------------------------------------------------------------
_CODE_KEYS = frozenset({"code", "prelude", "source"})


def redact_value(value, key: str | None = None):
    """Redact every string inside ``value`` (dicts, lists, tuples; numbers are kept).

    A list or tuple of strings is redacted as command-line arguments (:func:`redact_args`);
    the values of ``code``/``prelude``/``source`` keys as Python source (:func:`redact_code`);
    a string under a key that names a secret (``{"db_pass": "..."}``) entirely. Dict keys are
    kept.
    """
    if isinstance(value, str):
        return redact_code(value) if key in _CODE_KEYS else redact(value)
    if isinstance(value, dict):
        return {k: REDACTED if isinstance(k, str) and isinstance(v, str) and v
                and k not in _CODE_KEYS and is_secret_name(k)
                else redact_value(v, k if isinstance(k, str) else None)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, str) for v in value):
            return redact_args(list(value))
        return [redact_value(v) for v in value]
    return value


def write_private(path: str, text: str, code: bool = True) -> str:
    """Write ``text`` redacted to ``path``, readable by its owner only (0600, any umask).

    Parameters
    ----------
    path : str
        A file in a session folder (replaced; a symlink there is not followed).
    text : str
        What to write; undecodable bytes read with ``errors="surrogateescape"`` survive.
    code : bool
        Redact as Python source (:func:`redact_code`) rather than as text.

    Returns
    -------
    str
        ``path``.
    """
    from .safe_write import write_inside

    if os.path.islink(path):
        os.unlink(path)  # replaced, never followed (write_inside refuses a symlink)
    folder, name = os.path.split(os.path.abspath(path))
    data = (redact_code(text) if code else redact(text)).encode("utf-8", "surrogateescape")
    write_inside(folder, name, data, overwrite=True, mode=0o600)  # atomic: temp + rename
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
    finally:
        os.close(fd)
    return path


def read_source(path: str) -> str:
    """The text of a script, undecodable bytes kept as surrogates (for :func:`write_private`)."""
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        return fh.read()


def redact_log(data: bytes, ext: str) -> bytes:
    """A loss/metrics log (CSV, JSON lines, JSON) with its secrets redacted, still a log.

    JSON is parsed and redacted value by value (:func:`redact_value`), CSV cell by cell (a
    column whose header names a secret entirely), so the numbers parse as before; what does not
    parse is redacted as text.
    """
    import csv
    import json

    text = data.decode("utf-8-sig", "surrogateescape")  # a BOM is no part of the header
    ext = ext.lower()
    if ext == ".json":
        try:
            return json.dumps(redact_value(json.loads(text)), ensure_ascii=False).encode(
                "utf-8", "surrogateescape")
        except (ValueError, RecursionError):
            return redact(text).encode("utf-8", "surrogateescape")
    if ext in (".jsonl", ".ndjson"):
        lines = []
        for line in text.splitlines(keepends=True):
            try:
                row = json.loads(line) if line.strip() else None
            except (ValueError, RecursionError):
                row = None
            if row is None:
                lines.append(redact(line))
            else:
                end = "\n" if line.endswith("\n") else ""
                lines.append(json.dumps(redact_value(row), ensure_ascii=False) + end)
        return "".join(lines).encode("utf-8", "surrogateescape")
    if ext == ".csv":
        try:
            rows = list(csv.reader(io.StringIO(text, newline="")))
        except csv.Error:
            return redact(text).encode("utf-8", "surrogateescape")
        secret = [is_secret_name(h) for h in rows[0]] if rows else []
        out = io.StringIO(newline="")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([redact(c) for c in rows[0]] if rows else [])
        for row in rows[1:]:
            writer.writerow([REDACTED if i < len(secret) and secret[i] and c else redact(c)
                             for i, c in enumerate(row)])
        return (out.getvalue() if rows else "").encode("utf-8", "surrogateescape")
    return redact(text).encode("utf-8", "surrogateescape")
