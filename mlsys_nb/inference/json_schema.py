"""The front ends of structured outputs: a request's ``json_schema`` or ``choice`` turned into the regex that
``structured.Grammar`` compiles, the refusals (``GrammarError``, naming the parameter), and the post-check.

- ``schema_regex(json_schema)``: the compact regex (no free whitespace) of a JSON schema, through outlines-core's
  ``build_regex_from_schema``, after ``enforceable_schema`` refused every keyword the regex would ignore
  (``SCHEMA_KEYWORDS`` lists the enforced ones) and turned ``format`` into an exact ASCII pattern
  (``FORMAT_PATTERNS``: date, time, date-time, uuid); ``\\d``/``\\w`` become ASCII as JSON Schema means them
  (``ascii_classes``).
- ``choice_regex(choices)``: one of the strings, longest first.
- ``schema_errors(text, json_schema)``: why a finished answer fails its schema (the server's post-check), or None.

Torch-free; outlines-core and jsonschema are imported when a schema is compiled or checked.
"""

from __future__ import annotations

import json

__all__ = [
    "FORMAT_PATTERNS",
    "GrammarError",
    "SCHEMA_KEYWORDS",
    "ascii_classes",
    "choice_regex",
    "enforceable_schema",
    "schema_errors",
    "schema_regex",
]

_META = set("\\.+*?()|[]{}^$#&-~")


class GrammarError(ValueError):
    """An invalid schema/regex, or a grammar that admits no output (raised before generation); ``param``
    names the request parameter at fault (None: the constraint itself)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def choice_regex(choices) -> str:
    """A regex matching exactly one of the strings in ``choices`` (metacharacters escaped), longest first:
    outlines-core's automaton gives an alternation leftmost priority, so in ``(a|ab)`` the branch ``a``
    wins and ``ab`` could never be generated; ``(ab|a)`` keeps both."""
    if isinstance(choices, str) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError(f"choice={choices!r}: allowed a non-empty list of non-empty strings")
    ordered = sorted(dict.fromkeys(choices), key=len, reverse=True)  # stable: equal lengths keep their order
    return "(" + "|".join("".join("\\" + ch if ch in _META else ch for ch in c) for c in ordered) + ")"


# JSON-schema keywords whose every output the regex enforces (or that only annotate); any other keyword is
# refused: outlines-core's regex ignores e.g. minimum/maximum/multipleOf/uniqueItems, and an ignored
# restriction would let through outputs that fail the schema. Keywords that only RELAX (additionalProperties)
# are safe to ignore: the regex then admits a subset of the valid documents.
SCHEMA_KEYWORDS = frozenset(
    "type properties required additionalProperties items prefixItems minItems maxItems minLength maxLength "
    "pattern enum const anyOf $ref $defs definitions format title description default examples $schema $id "
    "$comment deprecated readOnly writeOnly".split()
)
# formats as exact regexes (ASCII digits; a date's day within its month, February to 28 so every year is valid;
# times in UTC with 'Z', as RFC 3339 requires an offset); other formats are refused
_DATE = (
    "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?Z"
FORMAT_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
}


def enforceable_schema(schema, path: str = "") -> dict:
    """A copy of ``schema`` whose every keyword the regex enforces (``format`` turned into an exact
    ``pattern``), or ``GrammarError`` naming the first keyword it would ignore (and its place)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise GrammarError(f"json_schema{path} must be an object")
    out = {}
    for key, value in schema.items():
        where = f"json_schema{path}.{key}"
        if key not in SCHEMA_KEYWORDS:
            raise GrammarError(
                f"{where}: the keyword {key!r} cannot be enforced by the token grammar, so it is refused "
                f"(enforced keywords: {', '.join(sorted(SCHEMA_KEYWORDS))})"
            )
        if key == "format":
            if value not in FORMAT_PATTERNS:
                raise GrammarError(
                    f"{where}: format {value!r} is refused (enforced formats: {sorted(FORMAT_PATTERNS)})"
                )
            if "pattern" in schema:
                raise GrammarError(f"{where}: format together with pattern is refused (one regex per string)")
            out["pattern"] = FORMAT_PATTERNS[value]
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise GrammarError(f"{where} must be an object")
            out[key] = {k: enforceable_schema(v, f"{path}.{key}.{k}") for k, v in value.items()}
        elif key in ("anyOf", "prefixItems") or (key == "items" and isinstance(value, list)):
            if not isinstance(value, list):
                raise GrammarError(f"{where} must be a list")
            out[key] = [enforceable_schema(v, f"{path}.{key}[{i}]") for i, v in enumerate(value)]
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = enforceable_schema(value, f"{path}.{key}")
        else:
            out[key] = value
    return out


def ascii_classes(regex: str) -> str:
    """``regex`` with ``\\d`` and ``\\w`` turned into ASCII classes, as JSON Schema's (ECMA 262) patterns
    mean them; the regex engine's ``\\d`` matches every Unicode digit (e.g. '٣')."""
    out, i, in_class = [], 0, False
    repl = {"d": ("[0-9]", "0-9"), "w": ("[A-Za-z0-9_]", "A-Za-z0-9_")}
    while i < len(regex):
        ch = regex[i]
        if ch == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            out.append(repl[nxt][in_class] if nxt in repl else regex[i : i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


def schema_regex(json_schema) -> str:
    """The compact regex (no free whitespace) of a JSON schema; GrammarError if the schema is invalid or
    uses a keyword the regex cannot enforce (``enforceable_schema``)."""
    import jsonschema
    from outlines_core.json_schema import build_regex_from_schema

    try:
        schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        if not isinstance(schema, dict):
            raise TypeError("a JSON schema is an object")
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except Exception as e:
        raise GrammarError(f"json_schema is invalid: {str(e).splitlines()[0]}") from None
    schema = enforceable_schema(schema)
    try:
        return ascii_classes(build_regex_from_schema(json.dumps(schema), whitespace_pattern=""))
    except Exception as e:
        raise GrammarError(f"json_schema is invalid or unsupported: {str(e).splitlines()[0]}") from None


def schema_errors(text: str, json_schema) -> str | None:
    """None if ``text`` is a JSON document valid under ``json_schema`` (formats checked too), else why not:
    the server's post-check, so that no answer that fails its schema is ever returned."""
    import jsonschema

    try:
        schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
    except (ValueError, jsonschema.ValidationError) as e:
        return str(e).splitlines()[0]
    return None
