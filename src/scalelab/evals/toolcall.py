"""Tool-calling tasks of our own, generated from a seed, each with a programmatic checker.

- `toolcall_schema`: three functions are offered, the request needs one; correct when the reply is a JSON
  call {"name", "arguments"} naming that function with arguments valid against its JSON schema (schema.py).
- `toolcall_args`: one function is offered; the request states the argument values in prose; scored per
  field against the values the request was generated from (`Score.partial` = share of fields right, an
  extra or missing field counts as wrong); correct when every field is right.

Requests are rendered from sampled argument values, so every gold call is known exactly. Train and test
are disjoint by content (tasks.in_holdout on the request text).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from scalelab.evals.schema import validate
from scalelab.evals.tasks import Example, Score, chat, check_split, in_holdout, register_task

Args = dict[str, Any]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type object
    sample: Callable[[np.random.Generator], Args]  # argument values a request will state
    templates: tuple[str, ...]  # str.format templates over the arguments (and derived `*_text` fields)

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def _pick(rng: np.random.Generator, options: tuple) -> Any:
    return options[int(rng.integers(len(options)))]


CITIES = ("Paris", "Lagos", "Osaka", "Lima", "Toronto", "Nairobi", "Oslo", "Hanoi", "Denver", "Porto")
AIRPORTS = ("CDG", "LOS", "KIX", "LIM", "YYZ", "NBO", "OSL", "HAN", "DEN", "OPO")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
PRODUCTS = ("running shoes", "desk lamp", "rain jacket", "coffee grinder", "usb cable", "yoga mat")
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "NGN", "CAD")
LABELS = ("gym", "standup", "pills", "school run", "call mom", "water plants")


def _weather(rng: np.random.Generator) -> Args:
    return {"city": _pick(rng, CITIES), "unit": _pick(rng, ("celsius", "fahrenheit")),
            "days": int(rng.integers(1, 8))}


def _flight(rng: np.random.Generator) -> Args:
    origin, destination = (AIRPORTS[i] for i in rng.choice(len(AIRPORTS), size=2, replace=False))
    return {"origin": origin, "destination": destination,
            "date": f"2025-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}",
            "passengers": int(rng.integers(1, 10)), "cabin": _pick(rng, ("economy", "business", "first"))}


def _alarm(rng: np.random.Generator) -> Args:
    days = sorted(rng.choice(len(WEEKDAYS), size=int(rng.integers(1, 4)), replace=False))
    return {"hour": int(rng.integers(0, 24)), "minute": int(rng.choice([0, 5, 15, 30, 45])),
            "label": _pick(rng, LABELS), "repeat": [WEEKDAYS[i] for i in days]}


def _products(rng: np.random.Generator) -> Args:
    return {"query": _pick(rng, PRODUCTS), "max_price": float(rng.integers(5, 400)),
            "in_stock": bool(rng.integers(2)), "limit": int(rng.integers(1, 21))}


def _currency(rng: np.random.Generator) -> Args:
    source, target = (CURRENCIES[i] for i in rng.choice(len(CURRENCIES), size=2, replace=False))
    return {"amount": round(float(rng.integers(1, 100_000)) / 100, 2), "source": source, "target": target}


def _obj(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}


TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("get_weather", "Weather forecast for a city.", _obj({
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}), _weather,
        ("What will the weather be in {city} over the next {days} day(s)? Give temperatures in {unit}.",
         "I need a {days}-day forecast for {city}, in {unit} please.")),
    Tool("book_flight", "Book seats on a flight.", _obj({
        "origin": {"type": "string", "minLength": 3, "maxLength": 3},
        "destination": {"type": "string", "minLength": 3, "maxLength": 3},
        "date": {"type": "string", "minLength": 10, "maxLength": 10},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "business", "first"]}}), _flight,
        ("Book {passengers} {cabin} seat(s) from {origin} to {destination} on {date}.",
         "We are {passengers} people flying {origin} -> {destination} on {date}; {cabin} class, please.")),
    Tool("set_alarm", "Set a repeating alarm.", _obj({
        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "minute": {"type": "integer", "minimum": 0, "maximum": 59}, "label": {"type": "string"},
        "repeat": {"type": "array", "items": {"type": "string", "enum": list(WEEKDAYS)}, "minItems": 1}}),
        _alarm, ("Set an alarm for {hour:02d}:{minute:02d} called \"{label}\" that repeats every {repeat_text}.",
                 "Wake me at {hour:02d}:{minute:02d} on {repeat_text}; label it \"{label}\".")),
    Tool("search_products", "Search the shop's catalogue.", _obj({
        "query": {"type": "string", "minLength": 1}, "max_price": {"type": "number", "minimum": 0},
        "in_stock": {"type": "boolean"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}}), _products,
        ("Show me up to {limit} results for \"{query}\" under ${max_price:.0f}, {stock_text}.",
         "Find \"{query}\" costing at most {max_price:.0f} dollars ({stock_text}); list {limit}.")),
    Tool("convert_currency", "Convert an amount between currencies.", _obj({
        "amount": {"type": "number", "minimum": 0}, "source": {"type": "string", "enum": list(CURRENCIES)},
        "target": {"type": "string", "enum": list(CURRENCIES)}}), _currency,
        ("How much is {amount:.2f} {source} in {target}?", "Convert {amount:.2f} {source} to {target}.")),
)}


def render_request(tool: Tool, args: Args, rng: np.random.Generator) -> str:
    derived = {"repeat_text": ", ".join(args.get("repeat", [])),
               "stock_text": "in stock only" if args.get("in_stock") else "including out-of-stock items"}
    return _pick(rng, tool.templates).format(**args, **derived)


# ---------------------------------------------------------------------------------------------
# reading a call out of a completion


def parse_call(completion: str) -> dict[str, Any] | None:
    """The first JSON object in the completion (fenced or bare) that parses, or None."""
    fenced = re.findall(r"```(?:json)?\s*\n(.*?)```", completion, re.DOTALL)
    decoder = json.JSONDecoder()
    for text in fenced + [completion]:
        for start in [m.start() for m in re.finditer(r"\{", text)]:
            try:
                value, _ = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def call_format_ok(completion: str) -> bool:
    call = parse_call(completion)
    return call is not None and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)


# ---------------------------------------------------------------------------------------------
# generation shared by both tasks


def draw_calls(split: str, n: int, seed: int, salt: int) -> list[tuple[Tool, Args, str]]:
    """`n` (tool, gold arguments, request) triples for `split`, tools in rotation."""
    rng = np.random.default_rng([seed, salt, 0 if split == "train" else 1])
    names = sorted(TOOLS)
    out, tries = [], 0
    while len(out) < n:
        tries += 1
        if tries > 1000 * (n + 10):
            raise ValueError(f"cannot generate {n} {split} tool calls")
        tool = TOOLS[names[len(out) % len(names)]]
        args = tool.sample(rng)
        request = render_request(tool, args, rng)
        if in_holdout(request) == (split == "test"):
            out.append((tool, args, request))
    return out


CALL_FORMAT = ('Reply with only a JSON object of the form {"name": <function name>, "arguments": '
               '{<argument>: <value>, ...}}.')


@register_task("toolcall_schema")
@dataclass(frozen=True)
class ToolCallSchema:
    default_size: int = 500
    name: ClassVar[str] = "toolcall_schema"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        rng = np.random.default_rng([seed, 7])
        out = []
        for i, (tool, args, request) in enumerate(draw_calls(split, limit if limit is not None else
                                                             self.default_size, seed, salt=1)):
            others = [t for t in sorted(TOOLS) if t != tool.name]
            offered = [tool.name] + [str(x) for x in rng.choice(others, size=2, replace=False)]
            offered = [offered[k] for k in rng.permutation(3)]
            specs = json.dumps([TOOLS[t].spec() for t in offered], indent=1)
            prompt = f"You can call these functions:\n{specs}\n\nRequest: {request}\n\n{CALL_FORMAT}"
            gold = json.dumps({"name": tool.name, "arguments": args})
            out.append(Example(self.name, f"{self.name}/{split}/s{seed}/{i}", chat(prompt), gold,
                               {"tool": tool.name, "offered": offered}))
        return out

    def score(self, example: Example, completion: str) -> Score:
        call = parse_call(completion)
        if call is None:
            return Score(False, None, "no JSON object in the completion")
        shown = json.dumps(call)[:500]
        if call.get("name") != example.meta["tool"]:
            return Score(False, shown, f"wrong function: {call.get('name')!r}, expected {example.meta['tool']!r}")
        errors = validate(call.get("arguments"), TOOLS[example.meta["tool"]].parameters, "$.arguments")
        return Score(not errors, shown, "valid call" if not errors else "; ".join(errors)[:300])

    def check_format(self, example: Example, completion: str) -> bool:
        return call_format_ok(completion)


# ---------------------------------------------------------------------------------------------
# argument extraction


def same_value(pred: Any, gold: Any) -> bool:
    """Field equality as a user means it: numbers by value, strings ignoring case and outer spaces, lists
    of strings as sets (the order of weekdays is not information the request fixed)."""
    if isinstance(gold, bool) or isinstance(pred, bool):
        return pred is gold
    if isinstance(gold, (int, float)):
        return isinstance(pred, (int, float)) and math.isclose(pred, gold, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(gold, str):
        return isinstance(pred, str) and pred.strip().casefold() == gold.strip().casefold()
    if isinstance(gold, list):
        return isinstance(pred, list) and sorted(map(str, pred)) == sorted(map(str, gold)) \
            and all(isinstance(p, str) for p in pred)
    return pred == gold


def field_scores(pred: Args, gold: Args) -> tuple[int, int, list[str]]:
    """(right, counted, problems): every gold field, plus every extra predicted field, counts once."""
    problems = [f"{k}: got {pred.get(k)!r}, expected {v!r}" for k, v in gold.items()
                if k not in pred or not same_value(pred[k], v)]
    extra = sorted(set(pred) - set(gold))
    problems += [f"{k}: not an argument" for k in extra]
    counted = len(gold) + len(extra)
    return counted - len(problems), counted, problems


@register_task("toolcall_args")
@dataclass(frozen=True)
class ToolCallArgs:
    default_size: int = 500
    name: ClassVar[str] = "toolcall_args"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        out = []
        for i, (tool, args, request) in enumerate(draw_calls(split, limit if limit is not None else
                                                             self.default_size, seed, salt=2)):
            spec = json.dumps(tool.spec(), indent=1)
            prompt = (f"Function:\n{spec}\n\nRequest: {request}\n\nExtract the arguments of the call this "
                      f"request asks for. {CALL_FORMAT}")
            out.append(Example(self.name, f"{self.name}/{split}/s{seed}/{i}", chat(prompt),
                               json.dumps({"name": tool.name, "arguments": args}), {"tool": tool.name}))
        return out

    def score(self, example: Example, completion: str) -> Score:
        call = parse_call(completion)
        gold = json.loads(example.answer)
        if call is None or not isinstance(call.get("arguments"), dict):
            return Score(False, None, "no JSON call with an 'arguments' object", partial=0.0)
        right, counted, problems = field_scores(call["arguments"], gold["arguments"])
        name_ok = call.get("name") == gold["name"]
        if not name_ok:
            problems.insert(0, f"function {call.get('name')!r}, expected {gold['name']!r}")
        ok = name_ok and not problems
        reason = f"{right}/{counted} fields right" + ("" if ok else ": " + "; ".join(problems))
        return Score(ok, json.dumps(call)[:500], reason[:300], partial=right / counted if counted else 0.0)

    def check_format(self, example: Example, completion: str) -> bool:
        return call_format_ok(completion)
