"""The ``script`` provider: replays a TOML script in-process.

A real provider with no runtime behind it, for tests, demos and users who test
their automation. Always available. A conversation's script is chosen by
``OpenRequest.model`` (a TOML file: absolute, relative to the workdir, or a
bare name in ``scripts_dir`` with or without ``.toml``); an empty model takes
``default_script``, else a built-in script that streams an echo of the prompt.
The format is documented in ``docs/script-format.md``.

Each prompt plays one ``[[turn]]`` of the script: the first whose ``match``
regex is found in the prompt, else the unmatched turns in order, cycling. Its
``[[turn.step]]`` tables stream text, run tools (``command`` really runs with
bash in the workdir once allowed), ask permissions, questions, forms and plan
reviews and wait for :meth:`ScriptConversation.respond`, start subagents,
report todos, usage, context and titles, sleep, wait, or fail.

State lives under ``<state_dir>/providers/<name>/``: ``<conversation_id>.json``
holds the transcript, the script path and the turn count (written atomically),
so a new provider instance reopens the exact conversation with its history;
``received.jsonl`` gets one fsynced line ``{conversation, text, ts, delivery}``
per prompt or steer before it is accepted, which proves no prompt is ever
played twice.
"""

from __future__ import annotations

import collections
import datetime as _dt
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import msgspec
import structlog
import trio

from .. import procs
from .._fsutil import make_dirs, read_file
from ..config import ScriptConfig
from .. import runtime_output
from ._common import runs_under
from ..contract import (
    MAX_TAIL_LINE_BYTES,
    MAX_TAIL_LINES,
    Answer,
    Attachment,
    Capabilities,
    Command,
    Closed,
    Context,
    ContextEvent,
    ConversationNotFound,
    Busy,
    Delta,
    DeltaEvent,
    Elicitation,
    Event,
    EventSink,
    Field,
    FieldFormat,
    FieldType,
    HistoryRecord,
    Interaction,
    InteractionEvent,
    InteractionGone,
    InteractionKind,
    InteractionState,
    ContextTier,
    Invalid,
    Item,
    NotFound,
    ItemEvent,
    ItemKind,
    Model,
    ModelSelection,
    ModelSelectionEvent,
    OpenRequest,
    Option,
    OutputLine,
    PlanAction,
    PlanReview,
    Prompt,
    Question,
    RuntimeUnavailable,
    Subagent,
    SubagentEvent,
    SubagentRun,
    SubagentStatus,
    TitleEvent,
    Todo,
    TodoList,
    TodosEvent,
    TokenUsage,
    TokensEvent,
    ToolCall,
    ToolStatus,
    Turn,
    TurnEvent,
    TurnState,
    Unsupported,
    Usage,
    UsageEvent,
    utcnow,
    validate_answer,
)

__all__ = [
    "ScriptConfig",
    "ScriptProvider",
    "ScriptConversation",
    "Script",
    "load_script",
    "parse_script",
    "resolve_script",
]

log = structlog.get_logger(__name__)

#: A command's captured output is bounded to its last this many bytes.
MAX_OUTPUT_BYTES = 64 * 1024
#: Running-tool tail updates are journaled items: at most one per this many seconds.
TAIL_EMIT_INTERVAL = 0.2
#: After bash exits, leftover background children get this long to close the pipes.
PIPE_GRACE = 1.0
#: SIGTERM to SIGKILL on cancel; cancel must return well under a second.
KILL_GRACE = 0.3

# --------------------------------------------------------------------------- config


# --------------------------------------------------------------------------- script format

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


#: ``when`` conditions: "<interaction>:<outcome>" of this turn's latest interaction of that kind
When = Literal["permission:allowed", "permission:rejected", "plan:approved", "plan:feedback",
               "question:answered", "form:answered"]


class _Step(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind", kw_only=True):
    """One ``[[turn.step]]``; ``kind`` picks the subclass.

    ``when`` (one condition or a list, all must hold) plays the step only after
    the answers it names: a script can branch on what the user answered.
    """

    when: When | list[When] = []


class TextStep(_Step, tag="text"):
    """An assistant message streamed in ``chunk``-character deltas every ``delay_ms``."""

    text: str
    chunk: Positive | None = None
    delay_ms: NonNegative | None = None


class ReasoningStep(_Step, tag="reasoning"):
    """Like ``text``, as a reasoning item."""

    text: str
    chunk: Positive | None = None
    delay_ms: NonNegative | None = None


class ToolStep(_Step, tag="tool"):
    """A tool call. With ``command`` it really runs ``bash -c command`` in the workdir;
    without, it reports ``output``/``exit_code`` after ``duration_ms``."""

    name: str = "bash"
    title: str = ""
    input: str = ""
    command: str | None = None
    output: str = ""
    exit_code: int = 0
    duration_ms: NonNegative = 0
    permission: bool = False


class SleepStep(_Step, tag="sleep"):
    ms: NonNegative


#: What a subagent's own steps may be.
SubagentStepSpec = Union[TextStep, ReasoningStep, ToolStep, SleepStep]


class QuestionStep(_Step, tag="question"):
    """One question with ``choices`` and/or ``custom`` free text; waits for the answer."""

    text: str
    title: str = ""
    header: str = ""
    choices: list[str] = []
    multiple: bool = False
    custom: bool = False
    #: true, or a template using {answer}: an assistant message after the answer
    echo: bool | str = False


class FormField(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One typed field of a ``form`` step (``[[turn.step.field]]``)."""

    name: str
    type: FieldType = "string"
    text: str = ""
    header: str = ""
    required: bool = False
    #: labels offered; ``values`` holds what each sends (default: the labels)
    choices: list[str] = []
    values: list[str] = []
    format: FieldFormat = ""
    minimum: float | None = None
    maximum: float | None = None
    min_length: NonNegative | None = None
    max_length: NonNegative | None = None
    min_items: NonNegative | None = None
    max_items: NonNegative | None = None


class FormStep(_Step, tag="form"):
    """An elicitation form: one question per typed field, validated before it is accepted."""

    field: Annotated[list[FormField], msgspec.Meta(min_length=1)]
    title: str = "Please fill in this form"
    detail: str = ""
    echo: bool | str = False


class PlanStep(_Step, tag="plan"):
    """A plan review: the answer is one of ``actions`` or feedback that refuses it."""

    summary: str = ""
    content: str = ""
    title: str = "Review the plan"
    actions: Annotated[list[PlanAction], msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: ["autopilot", "interactive", "exit_only"])
    recommended: PlanAction | None = None
    echo: bool | str = False


class SubagentStep(_Step, tag="subagent"):
    """A subagent behind a ``task`` tool item: its own steps, then ``text`` as its report."""

    name: str
    description: str = ""
    model: str = ""
    step: list[SubagentStepSpec] = []
    text: str = ""
    #: non-empty: the subagent ends failed with this error
    fail: str = ""


class TodoSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    title: str
    status: Literal["pending", "in_progress", "done", "blocked"] = "pending"
    id: str = ""
    note: str = ""


class TodosStep(_Step, tag="todos"):
    """The whole todo list as it stands now."""

    todo: list[TodoSpec] = []


class UsageStep(_Step, tag="usage"):
    """One model call's tokens; the conversation's running totals follow."""

    model: str = ""
    input: NonNegative = 0
    output: NonNegative = 0
    cache_read: NonNegative = 0
    cache_write: NonNegative = 0
    duration_ms: NonNegative = 0
    cost_usd: float | None = None
    ai_units: float = 0.0


class ContextStep(_Step, tag="context"):
    used: NonNegative
    limit: Positive
    prompt: NonNegative = 0
    cached: NonNegative = 0


class TitleStep(_Step, tag="title"):
    title: str


class FailStep(_Step, tag="fail"):
    """Ends the turn failed with ``error``."""

    error: str = "the script failed this turn"


class UnknownEventStep(_Step, tag="unknown_event"):
    """What a newer runtime does: an event of a kind agentd does not know (an ``unknown`` record)."""

    type: str
    data: dict[str, Any] = {}


class WaitStep(_Step, tag="wait"):
    """Waits until the turn is cancelled, or (``until = "steer"``) until a steer arrives."""

    until: Literal["cancel", "steer"] = "cancel"


Step = Union[
    TextStep,
    ReasoningStep,
    ToolStep,
    QuestionStep,
    FormStep,
    PlanStep,
    SubagentStep,
    TodosStep,
    UsageStep,
    ContextStep,
    TitleStep,
    FailStep,
    SleepStep,
    WaitStep,
    UnknownEventStep,
]


class TurnSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``[[turn]]``: played for a prompt that ``match`` (a regex) is found in."""

    match: str = ""
    name: str = ""
    step: list[Step] = []


class ScriptModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[models]]``: a model the script answers as (``agentctl set-model CONV ID``), with the
    effort levels and context tiers it takes; the turn reports it as its model, and
    ``received.jsonl`` records it with each prompt."""

    id: Annotated[str, msgspec.Meta(min_length=1)]
    name: str = ""
    efforts: list[str] = []
    context_tiers: list[ContextTier] = []
    cost_tier: Literal["", "low", "medium", "high", "very_high"] = ""


class Script(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A whole script file. ``chunk``/``delay_ms`` are defaults for streamed text."""

    turn: Annotated[list[TurnSpec], msgspec.Meta(min_length=1)]
    description: str = ""
    #: reported as the turn's model; default: the first of ``models``, else the file's stem
    model: str = ""
    #: the models it declares (``agentctl models script`` lists those of the scripts in scripts_dir)
    models: list[ScriptModel] = []
    chunk: Positive = 16
    delay_ms: NonNegative = 20
    #: ``[[command]]``: the slash commands a conversation on this script offers (name, kind, ...)
    command: list[Command] = []


class _Loaded:
    """A validated script with its compiled patterns."""

    __slots__ = ("path", "script", "label", "patterns")

    def __init__(self, path: Path | None, script: Script) -> None:
        self.path = path
        self.script = script
        self.label = script.model or (script.models[0].id if script.models else path.stem if path else "echo")
        self.patterns = [re.compile(t.match) if t.match else None for t in script.turn]

    def select(self, prompt: str, turn_no: int) -> TurnSpec:
        """The first turn whose pattern is found in ``prompt``, else the
        ``turn_no``-th (1-based) unmatched turn, cycling. Raises Invalid."""
        for spec, pattern in zip(self.script.turn, self.patterns):
            if pattern is not None and pattern.search(prompt):
                return spec
        plain = [t for t, p in zip(self.script.turn, self.patterns) if p is None]
        if not plain:
            raise Invalid(f"script {self.path}: no [[turn]] matches this prompt and none is without match")
        return plain[(turn_no - 1) % len(plain)]


_BUILTIN = _Loaded(None, Script(turn=[TurnSpec(step=[TextStep(text="You said: {prompt}")])], model="echo"))


def parse_script(data: bytes | str, *, source: str = "<script>") -> Script:
    """Decode and check a script; raises Invalid naming ``source`` and the key path."""
    try:
        script = msgspec.toml.decode(data, type=Script)
    except msgspec.ValidationError as exc:
        raise Invalid(f"script {source}: {exc}", details={"file": source}) from None
    except msgspec.DecodeError as exc:
        raise Invalid(f"script {source}: not valid TOML: {exc}", details={"file": source}) from None
    for problem in _problems(script):
        raise Invalid(f"script {source}: {problem}", details={"file": source})
    return script


def _problems(script: Script):
    """Yields what the schema cannot say, each ending with its key path."""
    for t, turn in enumerate(script.turn):
        if turn.match:
            try:
                re.compile(turn.match)
            except re.error as exc:
                yield f"invalid regex {turn.match!r}: {exc} - at `$.turn[{t}].match`"
        for s, step in enumerate(turn.step):
            at = f"$.turn[{t}].step[{s}]"
            if isinstance(step, QuestionStep) and not step.choices and not step.custom:
                yield f"a question needs choices or custom = true - at `{at}`"
            if isinstance(step, PlanStep) and step.recommended and step.recommended not in step.actions:
                yield f"recommended {step.recommended!r} is not one of actions - at `{at}.recommended`"
            if isinstance(step, FormStep):
                names = [f.name for f in step.field]
                for i, f in enumerate(step.field):
                    fat = f"{at}.field[{i}]"
                    if names.count(f.name) > 1:
                        yield f"field name {f.name!r} is repeated - at `{fat}.name`"
                    if f.type == "array" and not f.choices:
                        yield f"an array field needs choices - at `{fat}.choices`"
                    if f.values and len(f.values) != len(f.choices):
                        yield f"values needs one entry per choice - at `{fat}.values`"


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and check the script at ``path``; raises Invalid (missing, unreadable, invalid)."""
    return _load(Path(path)).script


def _load(path: Path | None) -> _Loaded:
    if path is None:
        return _BUILTIN
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise Invalid(f"script {path}: cannot read it: {exc.strerror or exc}", details={"file": str(path)}) from None
    return _Loaded(path, parse_script(data, source=str(path)))


def resolve_script(model: str, *, workdir: str, scripts_dir: str | Path = "", default_script: str = "") -> Path | None:
    """The script file named by ``model`` (or ``default_script`` when empty).

    Looks at an absolute path as is; a relative one in ``workdir``, then in
    ``scripts_dir`` (also with ``.toml`` added). Returns None for the built-in
    echo script (both names empty). Raises Invalid listing where it looked.
    """
    name = model or default_script
    if not name:
        return None
    try:
        p = Path(name).expanduser()
    except RuntimeError as exc:  # ~user of no such user
        raise Invalid(f"script {_clip(name)!r}: {exc}", details={"file": _clip(name)}) from None
    candidates: list[Path] = []
    if p.is_absolute():
        candidates.append(p)
    else:
        if workdir:
            candidates.append(Path(workdir) / p)
        if scripts_dir:
            d = Path(scripts_dir).expanduser()
            candidates.append(d / p)
            if p.suffix != ".toml":
                candidates.append(d / f"{name}.toml")
    problem = ""
    for candidate in candidates:
        try:
            if candidate.is_file():
                return candidate.resolve()
        except (OSError, RuntimeError) as exc:  # a name too long, a loop of links: no script there
            problem = problem or f" ({getattr(exc, 'strerror', None) or exc})"
    where = ", ".join(_clip(str(c)) for c in candidates) or "nowhere (no workdir or scripts_dir)"
    raise Invalid(f"script {_clip(name)!r} not found; looked at: {where}{problem}", details={"file": _clip(name)})


def _clip(text: str, limit: int = 300) -> str:
    """``text``, its middle cut when long (a message names a path, it does not carry a huge one)."""
    return text if len(text) <= limit else f"{text[:limit // 2]}…{text[-limit // 2:]} ({len(text)} chars)"


# --------------------------------------------------------------------------- persistence


class _Record(msgspec.Struct, omit_defaults=True):
    """``<conversation_id>.json``: everything a reopen needs."""

    id: str
    workdir: str
    #: absolute path; "" = the built-in echo script
    script: str = ""
    title: str = ""
    turns: int = 0
    #: a model the script declares, chosen with set_model ("" = the script's own label), and its settings
    model: str = ""
    effort: str = ""
    context_tier: str = ""
    items: list[Item] = []
    subagents: list[Subagent] = []
    usage: Usage | None = None
    allowed_tools: list[str] = []
    created_at: _dt.datetime | None = None
    updated_at: _dt.datetime | None = None


_record_decoder = msgspec.json.Decoder(_Record)
_encoder = msgspec.json.Encoder()
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _atomic_write(path: Path, data: bytes) -> None:
    """Write, fsync, rename, fsync the directory: a reader sees the old or the new file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def _append_fsync(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- provider


class ScriptProvider:
    """Replays TOML scripts; see the module docstring. Implements contract.Provider."""

    display_name = "Script (TOML replay)"

    def __init__(self, config: ScriptConfig, *, state_dir: Path, name: str = "script") -> None:
        self.name = name
        self.config = config
        self.dir = Path(state_dir) / "providers" / name
        self.state_dir = Path(state_dir)
        self.scripts_dir = Path(config.scripts_dir).expanduser() if config.scripts_dir else Path(state_dir) / "scripts"
        self._nursery: trio.Nursery | None = None
        self._open: dict[str, ScriptConversation] = {}
        self._received_lock = trio.Lock()

    @property
    def received_path(self) -> Path:
        """``received.jsonl``: one line per accepted prompt or steer."""
        return self.dir / "received.jsonl"

    def conversation_path(self, conversation_id: str) -> Path:
        return self.dir / f"{conversation_id}.json"

    def resolve(self, model: str, workdir: str) -> Path | None:
        """The script for ``model`` (see :func:`resolve_script`), else the script in ``scripts_dir``
        that declares ``model`` in its ``[[models]]``; None = built-in echo. Raises Invalid."""
        try:
            return resolve_script(model, workdir=workdir, scripts_dir=self.scripts_dir,
                                  default_script=self.config.default_script)
        except Invalid:
            try:
                paths = sorted(self.scripts_dir.glob("*.toml"))
            except OSError as exc:
                raise Invalid(f"cannot list the scripts in {self.scripts_dir}: {exc.strerror or exc}") from None
            for path in paths:
                try:
                    if any(m.id == model for m in _load(path).script.models):
                        return path.resolve()
                except Invalid:
                    continue
            raise

    def capabilities(self) -> Capabilities:
        return Capabilities(
            cancel=True,
            steer=True,
            permissions=True,
            questions=True,
            plan=True,
            history=True,
            reopen=True,
            models=True,
            set_model=True,
            titles=True,
            usage=True,
            context_size=True,
            subagents=True,
            todos=True,
            attachments=True,
            fork=True,
            rewind=True,
            commands=True,
            cancel_subagent=True,
        )

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; every turn runs as a task in the nursery owned here.

        On cancellation running turns end cancelled (reason ``shutdown``, their
        pending interactions expired) and every open conversation becomes closed.
        """
        if self._nursery is not None:
            raise RuntimeError(f"provider {self.name!r} is already running")
        await trio.to_thread.run_sync(make_dirs, self.dir)  # 0700, parents too
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for conv in list(self._open.values()):
                conv._closed = True
            self._open.clear()

    async def check(self) -> None:
        """Raises RuntimeUnavailable when disabled or ``scripts_dir`` is missing."""
        await trio.lowlevel.checkpoint()
        if not self.config.enabled:
            raise RuntimeUnavailable("the script provider is disabled in the config (enabled = false)")
        if self.config.scripts_dir and not Path(self.config.scripts_dir).expanduser().is_dir():
            raise RuntimeUnavailable(f"scripts_dir {self.config.scripts_dir!r} is not a directory")

    #: any script path is a model too: the daemon leaves a model not listed to :meth:`open` and set_model
    open_catalog = True

    async def models(self) -> list[Model]:
        """The models the scripts in ``scripts_dir`` declare (``[[models]]``), then one per script
        there that declares none (its bare name). Unsupported when there are none."""

        def scan() -> list[Model]:
            out: list[Model] = []
            try:
                paths = sorted(self.scripts_dir.glob("*.toml"))
            except OSError:
                return out
            for path in paths:
                try:
                    loaded = _load(path)
                except Invalid:
                    continue
                if not loaded.script.models:
                    out.append(Model(id=path.stem, name=loaded.script.description or loaded.label))
                out += [Model(id=m.id, name=m.name, efforts=list(m.efforts), context_tiers=list(m.context_tiers),
                              cost_tier=m.cost_tier) for m in loaded.script.models]
            return out

        found = await trio.to_thread.run_sync(scan)
        if not found:
            raise Unsupported(f"no script in {self.scripts_dir} declares a model; pass a script path as the model")
        return found

    async def open(self, request: OpenRequest, sink: EventSink) -> ScriptConversation:
        """Create a conversation (empty ``conversation_id``) or reopen exactly that id.

        Raises ConversationNotFound when no record of the id exists (never
        creates one), Invalid for a missing or invalid script or workdir,
        Busy when the id is already open here, Closed when run() is not serving.
        """
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        await trio.to_thread.run_sync(make_dirs, self.dir)  # 0700, parents too
        if request.conversation_id:
            record = await self._read_record(request.conversation_id)
            if record.id in self._open:
                raise Busy(f"conversation {record.id} is already open")
            if request.workdir:
                record.workdir = request.workdir
            _check_workdir(record.workdir)
            script = _load(Path(record.script) if record.script else None)
        else:
            _check_workdir(request.workdir)
            path = self.resolve(request.model, request.workdir)
            script = _load(path)
            now = utcnow()
            chosen = next((m for m in script.script.models if m.id == request.model), None)
            record = _Record(
                id=str(uuid.uuid4()),
                workdir=request.workdir,
                script=str(path or ""),
                title=request.title,
                created_at=now,
                model=chosen.id if chosen else "",
                effort=request.effort if chosen and request.effort in chosen.efforts else "",
                context_tier=request.context_tier
                if chosen and request.context_tier in [t.id for t in chosen.context_tiers] else "",
            )
        conv = ScriptConversation(self, record, script, sink)
        if not request.conversation_id:
            await conv._save()
        self._open[record.id] = conv
        return conv

    async def fork(self, source: str, marker: str, request: OpenRequest) -> str:
        """A new conversation whose record holds ``source``'s transcript through its turn number
        ``marker`` (the ``Turn.marker`` of that turn): the history later turns' ``{history}``
        sees. Plays nothing. Raises ConversationNotFound, Invalid (no such turn)."""
        record = await self._read_record(source)
        n = _turn_no(marker)
        if n < 1 or n > record.turns:
            raise Invalid(f"script conversation {source} has no turn {marker!r}")
        copy = _Record(id=str(uuid.uuid4()), workdir=request.workdir or record.workdir, script=record.script,
                       title=request.title or record.title, turns=n, items=_through(record.items, n),
                       subagents=_through(record.subagents, n), allowed_tools=list(record.allowed_tools),
                       created_at=utcnow())
        data = _encoder.encode(copy)
        await trio.to_thread.run_sync(_atomic_write, self.conversation_path(copy.id), data)
        return copy.id

    async def _read_record(self, conversation_id: str) -> _Record:
        if not _ID.fullmatch(conversation_id):
            raise ConversationNotFound(f"no script conversation {conversation_id!r}")
        path = self.conversation_path(conversation_id)
        try:
            data = await trio.to_thread.run_sync(read_file, path)
        except FileNotFoundError:
            raise ConversationNotFound(f"no script conversation {conversation_id!r} in {self.dir}") from None
        try:
            return _record_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise Invalid(f"conversation record {path} is damaged: {exc}") from None

    async def _account(self, conversation_id: str, text: str, delivery: str, selection: dict[str, str] | None = None) -> None:
        """Append and fsync one ``received.jsonl`` line; runs before a prompt is accepted.

        ``selection`` (the model, effort and context tier in effect) goes in the line too: the
        script's stand-in for the model request a runtime sends."""
        line = _encoder.encode({"conversation": conversation_id, "text": text, "ts": utcnow(), "delivery": delivery,
                                **(selection or {})})
        async with self._received_lock:
            await trio.to_thread.run_sync(_append_fsync, self.received_path, line + b"\n")

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        self._nursery.start_soon(fn, *args)


def _turn_no(marker: str) -> int:
    return int(marker) if marker.isdigit() else 0


def _through(entries: list[Any], n: int) -> list[Any]:
    """The items (or subagents) of turns 1..n: their ids begin with their turn's number."""
    return [e for e in entries if _turn_no((getattr(e, "parent_tool_call_id", "") or e.id).split("-", 1)[0]) <= n]


def _check_workdir(workdir: str) -> None:
    if not workdir or not os.path.isdir(workdir):
        raise Invalid(f"workdir {workdir!r} is not a directory")


# --------------------------------------------------------------------------- conversation


class _TurnFailed(Exception):
    """A ``fail`` step: the turn ends failed with this message."""


class _Pending:
    __slots__ = ("interaction", "done", "answer", "text")

    def __init__(self, interaction: Interaction) -> None:
        self.interaction = interaction
        self.done = trio.Event()
        self.answer: Answer | None = None
        #: the answer as display text, for {answer}
        self.text = ""


class _Turn:
    """A running turn: its cancel scope and what cancellation must finish."""

    def __init__(self, no: int, prompt: str, history: str, spec: TurnSpec, script: _Loaded) -> None:
        self.no = no
        self.prompt = prompt
        self.history = history
        self.spec = spec
        self.script = script
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.steers: list[str] = []
        self.steers_consumed = 0
        self.steered = trio.Event()
        self.answer = ""
        #: interaction kind (permission, plan, question, form) -> outcome of its latest answer, for ``when``
        self.outcomes: dict[str, str] = {}
        self.pending: dict[str, _Pending] = {}
        #: items streamed or running, by (agent_id, id): finished on cancel
        self.live: dict[tuple[str, str], Item] = {}
        self.subagents: dict[str, Subagent] = {}
        #: the cancel scope of each subagent running now (``cancel_subagent`` stops only that one)
        self.subagent_scopes: dict[str, trio.CancelScope] = {}
        #: why the scope was cancelled: "" (cancel), "closed"; None = shutdown
        self.stop_reason: str | None = None
        #: files sent with the prompt, for {attachments}
        self.attachments: list[Attachment] = []

    def render(self, template: str) -> str:
        values = {
            "prompt": self.prompt,
            "history": self.history,
            "steer": " | ".join(self.steers),
            "answer": self.answer,
            "attachments": ", ".join(a.name for a in self.attachments),
        }
        # One pass, so a prompt containing "{history}" is not expanded again.
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


_PLACEHOLDER = re.compile(r"\{(prompt|history|steer|answer|attachments)\}")


def _permission_options(tool: str) -> list[Option]:
    return [
        Option(id="allow_once", label="Allow once", allow_once=True),
        Option(id="allow_always", label=f"Always allow {tool} in this conversation"),
        Option(id="reject", label="Reject", reject=True),
    ]


class ScriptConversation:
    """One script conversation; implements contract.Conversation.

    Every method raises Closed after :meth:`close` or once the provider stopped.
    """

    def __init__(self, provider: ScriptProvider, record: _Record, script: _Loaded, sink: EventSink) -> None:
        self._provider = provider
        self._record = record
        self._script = script
        self._sink = sink
        self._path = provider.conversation_path(record.id)
        self._turn: _Turn | None = None
        self._starting = False
        self._closed = False
        self._save_lock = trio.Lock()
        #: the keepers of its tool commands running now: the script's "runtime" processes
        self._tool_keepers: set[int] = set()
        runs_under(sink, lambda: frozenset(self._tool_keepers))

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def workdir(self) -> str:
        return self._record.workdir

    # ------------------------------------------------------------------ public API

    async def send(self, prompt: Prompt) -> None:
        """Start a turn; returns once it is accepted (the turn runs on in the provider).

        Emits the user item, TurnEvent(working), the steps' events, then a
        terminal TurnEvent. Raises Busy while a turn runs, Invalid when no
        ``[[turn]]`` fits the prompt, Closed when closed. The prompt is
        recorded in ``received.jsonl`` first; caller cancellation does not
        interrupt that accept step, so a prompt is either not taken or played.
        """
        self._check_open()
        if self._turn is not None or self._starting:
            raise Busy(f"a turn is running in conversation {self.id}")
        no = self._record.turns + 1
        spec = self._script.select(prompt.text, no)
        self._starting = True
        try:
            with trio.CancelScope(shield=True):
                await self._provider._account(self.id, prompt.text, "send", self._selection())
                self._check_open()
                history = " | ".join(i.text for i in self._record.items if i.kind is ItemKind.USER and not i.agent_id)
                turn = _Turn(no, prompt.text, history, spec, self._script)
                turn.attachments = list(prompt.attachments)
                # The task runs only after our next checkpoint, so the events below come first.
                self._provider._spawn(self._play, turn)
                self._record.turns = no
                self._turn = turn
                self._put(turn, Item(id=f"{no}-0", kind=ItemKind.USER, text=prompt.text, time=utcnow(),
                                     attachments=list(prompt.attachments)))
                self._emit(TurnEvent(turn=Turn(state=TurnState.WORKING, model=self.model)))
                await self._save()
        finally:
            self._starting = False

    async def cancel_subagent(self, agent_id: str) -> None:
        """Stop only subagent ``agent_id`` of the running turn: it ends cancelled, its ``task`` tool
        item failed, and the turn's later steps run. Raises NotFound when no such subagent runs."""
        self._check_open()
        await trio.lowlevel.checkpoint()
        turn = self._turn
        scope = turn.subagent_scopes.get(agent_id) if turn is not None else None
        if scope is None:
            raise NotFound(f"no subagent {agent_id!r} is running")
        scope.cancel()

    async def prompt_subagent(self, agent_id: str, text: str) -> None:
        """Raises Unsupported: a script's subagents never wait idle for a follow-up."""
        await trio.lowlevel.checkpoint()
        raise Unsupported("the script provider's subagents take no follow-up prompts")

    async def commands(self) -> list[Command]:
        """The script's ``[[command]]`` list."""
        self._check_open()
        await trio.lowlevel.checkpoint()
        return list(self._script.script.command)

    async def run_command(self, name: str, args: Prompt) -> None:
        """Play the turn for the prompt ``/name args`` (as ``send``); Invalid for a name not listed."""
        if not any(cmd.name == name for cmd in self._script.script.command):
            raise Invalid(f"the script offers no command /{name}")
        text = f"/{name} {args.text}" if args.text else f"/{name}"
        await self.send(Prompt(text=text, attachments=list(args.attachments)))

    async def steer(self, prompt: Prompt) -> None:
        """Add ``prompt`` to the running turn as a user item with delivery "steer".

        Later ``{steer}`` placeholders show it, and a ``wait until = "steer"``
        step resumes. Raises Invalid when no turn runs, Closed when closed.
        """
        self._check_open()
        turn = self._turn
        if turn is None:
            raise Invalid("no turn is running")
        with trio.CancelScope(shield=True):
            await self._provider._account(self.id, prompt.text, "steer", self._selection())
            # Accounted means accepted: recorded even if the turn ended meanwhile.
            turn.steers.append(prompt.text)
            self._put(turn, Item(id=f"{turn.no}-steer{len(turn.steers)}", kind=ItemKind.USER, text=prompt.text,
                                 time=utcnow(), delivery="steer", attachments=list(prompt.attachments)))
            steered, turn.steered = turn.steered, trio.Event()
            steered.set()
            await self._save()

    async def cancel(self) -> None:
        """Cancel the running turn and wait until it ended; no turn: a no-op.

        Emits, in order: pending interactions as expired (resolution
        "cancelled"), streamed items with their text so far, running tools as
        failed "cancelled" (a command's process group gets SIGTERM, SIGKILL
        after 0.3 s), running subagents as cancelled, then TurnEvent(cancelled).
        """
        self._check_open()
        turn = self._turn
        if turn is None:
            await trio.lowlevel.checkpoint()
            return
        turn.stop_reason = ""
        turn.scope.cancel()
        await turn.done.wait()

    async def respond(self, interaction_id: str, answer: Answer) -> None:
        """Answer a pending interaction of the running turn.

        Raises Invalid when the answer does not fit (the interaction stays
        pending), InteractionGone when it is not pending. Emits the
        interaction again as answered or rejected, with its resolution.
        """
        self._check_open()
        turn = self._turn
        pending = turn.pending.get(interaction_id) if turn else None
        if turn is None or pending is None:
            raise InteractionGone(f"interaction {interaction_id!r} is not pending")
        validate_answer(pending.interaction, answer)
        state, resolution = _resolve(pending.interaction, answer)
        del turn.pending[interaction_id]
        pending.answer = answer
        pending.text = resolution
        self._emit(InteractionEvent(interaction=msgspec.structs.replace(
            pending.interaction, state=state, resolution=resolution)))
        pending.done.set()
        await trio.lowlevel.checkpoint()

    async def rewind(self, marker: str) -> None:
        """Keep the transcript through turn number ``marker``, drop the later turns (their items,
        subagents and numbers: the next turn is ``marker`` + 1). Raises Busy, Invalid."""
        self._check_open()
        if self._turn is not None or self._starting:
            raise Busy(f"a turn is running in conversation {self.id}")
        n = _turn_no(marker)
        if n < 1 or n > self._record.turns:
            raise Invalid(f"script conversation {self.id} has no turn {marker!r}")
        self._record.items = _through(self._record.items, n)
        self._record.subagents = _through(self._record.subagents, n)
        self._record.turns = n
        await self._save()

    async def history(self) -> HistoryRecord:
        """The recorded transcript (user items and finished items), oldest first."""
        self._check_open()
        await trio.lowlevel.checkpoint()
        r = self._record
        return HistoryRecord(items=list(r.items), subagents=list(r.subagents), usage=r.usage, model=self.model)

    @property
    def model(self) -> str:
        """The model turns report: the declared model chosen, else the script's label."""
        return self._record.model or self._script.label

    def _selection(self) -> dict[str, str]:
        out = {"model": self.model}
        if self._record.effort:
            out["effort"] = self._record.effort
        if self._record.context_tier:
            out["context_tier"] = self._record.context_tier
        return out

    async def set_model(self, model: str, effort: str = "", context_tier: str = "") -> None:
        """Switch to ``model`` from the next turn on: a model the current script declares (with an
        effort and context tier it lists), else the script ``model`` names (or one in scripts_dir that
        declares it), whose first declared model, if any, becomes the model.

        Raises Invalid for a missing or invalid script, or an effort / tier the model does not list;
        Unsupported for an effort or tier when the model declares none.
        """
        self._check_open()
        declared = {m.id: m for m in self._script.script.models}
        if model and model not in declared or not declared:
            path = self._provider.resolve(model, self.workdir) if model else (
                Path(self._record.script) if self._record.script else None)
            script = _load(path)
            declared = {m.id: m for m in script.script.models}
            chosen = declared.get(model) or (script.script.models[0] if script.script.models else None)
        else:
            path, script = (Path(self._record.script) if self._record.script else None), self._script
            chosen = declared.get(model or self.model)
        for what, value, allowed in (("effort", effort, chosen.efforts if chosen else []),
                                     ("context tier", context_tier, [t.id for t in chosen.context_tiers] if chosen else [])):
            if value and not allowed:
                raise Unsupported(f"script model {chosen.id if chosen else script.label!r} declares no {what}s"
                                  if chosen else f"scripts without [[models]] have no {what}s")
            if value and value not in allowed:
                raise Invalid(f"unknown {what} {value!r} for model {chosen.id!r}; allowed: {', '.join(allowed)}")
        self._script = script
        self._record.script = str(path or "")
        self._record.model = chosen.id if chosen else ""
        if effort or chosen is None or model:
            self._record.effort = effort
        if context_tier or chosen is None or model:
            self._record.context_tier = context_tier
        with trio.CancelScope(shield=True):
            await self._save()
        self._emit(ModelSelectionEvent(selection=ModelSelection(
            model=self.model, effort=self._record.effort or None, context_tier=self._record.context_tier or None)))

    async def set_title(self, title: str) -> None:
        """Record the title and emit a TitleEvent."""
        self._check_open()
        self._record.title = title
        with trio.CancelScope(shield=True):
            await self._save()
        self._emit(TitleEvent(title=title))

    async def close(self) -> None:
        """Cancel a running turn (its events as for :meth:`cancel`, reason "closed")
        and save. Idempotent; every other method raises Closed afterwards."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            turn = self._turn
            if turn is not None:
                turn.stop_reason = "closed"
                turn.scope.cancel()
                await turn.done.wait()
            await self._save_quietly()
        self._provider._open.pop(self.id, None)

    # ------------------------------------------------------------------ plumbing

    def _check_open(self) -> None:
        if self._closed or self._provider._nursery is None:
            raise Closed(f"conversation {self.id} is closed")

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)

    def _put(self, turn: _Turn, item: Item, *, live: bool = False) -> None:
        """Emit ``item``; a live item (streaming, running) is tracked for cancel,
        a finished one replaces its earlier version in the transcript.
        Items are never mutated after they are emitted (sinks keep them)."""
        key = (item.agent_id, item.id)
        self._emit(ItemEvent(item=item))
        if live:
            turn.live[key] = item
            return
        turn.live.pop(key, None)
        items = self._record.items
        for i in range(len(items) - 1, -1, -1):
            if (items[i].agent_id, items[i].id) == key:
                items[i] = item
                return
        items.append(item)

    def _put_subagent(self, turn: _Turn, sub: Subagent) -> None:
        self._emit(SubagentEvent(subagent=sub))
        if sub.status.terminal:
            turn.subagents.pop(sub.id, None)
        else:
            turn.subagents[sub.id] = sub
        subs = self._record.subagents
        for i, old in enumerate(subs):
            if old.id == sub.id:
                subs[i] = sub
                return
        subs.append(sub)

    async def _save(self) -> None:
        async with self._save_lock:
            self._record.updated_at = utcnow()
            data = _encoder.encode(self._record)
            await trio.to_thread.run_sync(_atomic_write, self._path, data)

    async def _save_quietly(self) -> None:
        try:
            await self._save()
        except OSError as exc:
            log.warning("script conversation not saved", conversation=self.id, error=str(exc))

    # ------------------------------------------------------------------ turn

    async def _play(self, turn: _Turn) -> None:
        """The turn task (in the provider's nursery); always ends with a terminal TurnEvent."""
        state, error = TurnState.CANCELLED, ""
        try:
            with turn.scope:
                try:
                    await self._steps(turn, turn.spec.step, str(turn.no), "")
                    state = TurnState.COMPLETED
                except _TurnFailed as exc:
                    state, error = TurnState.FAILED, str(exc)
        except Exception as exc:  # a bug must not take the provider's nursery down
            log.exception("script turn crashed", conversation=self.id, turn=turn.no)
            state, error = TurnState.FAILED, f"script provider error: {exc}"
        finally:
            self._end_turn(turn, state, error)
            with trio.CancelScope(shield=True):
                await self._save_quietly()

    def _end_turn(self, turn: _Turn, state: TurnState, error: str) -> None:
        """Finish what the turn left open, then emit its terminal TurnEvent."""
        reason = ""
        if state is TurnState.CANCELLED:
            reason = "shutdown" if turn.stop_reason is None else turn.stop_reason
        why = reason or ("cancelled" if state is TurnState.CANCELLED else error or "turn ended")
        for pending in turn.pending.values():
            self._emit(InteractionEvent(interaction=msgspec.structs.replace(
                pending.interaction, state=InteractionState.EXPIRED, resolution=why)))
        turn.pending.clear()
        now = utcnow()
        for item in reversed(list(turn.live.values())):
            if item.tool is not None:
                out = item.tool.output
                tool = msgspec.structs.replace(item.tool, status=ToolStatus.FAILED, tail=[],
                                               output=f"{out}\n{why}" if out else why)
                item = msgspec.structs.replace(item, tool=tool)
            self._put(turn, msgspec.structs.replace(item, ended_at=now))
        status = SubagentStatus.CANCELLED if state is TurnState.CANCELLED else SubagentStatus.FAILED
        for sub in list(turn.subagents.values()):
            self._put_subagent(turn, _end_subagent(sub, status, now, "" if status is SubagentStatus.CANCELLED else why))
        self._turn = None
        # Its number is how fork and rewind name the turn (item ids begin with it).
        self._emit(TurnEvent(turn=Turn(state=state, error=error, reason=reason, model=self.model,
                                       marker=str(turn.no))))
        turn.done.set()

    async def _steps(self, turn: _Turn, steps: list[Any], prefix: str, agent_id: str) -> None:
        for n, step in enumerate(steps, 1):
            await self._step(turn, step, f"{prefix}-{n}", agent_id)
            if not agent_id:
                await self._save()

    async def _step(self, turn: _Turn, step: Any, item_id: str, agent_id: str) -> None:
        script = turn.script.script
        when = [step.when] if isinstance(step.when, str) else step.when
        if any(turn.outcomes.get(cond.split(":")[0]) != cond.split(":")[1] for cond in when):
            return  # an answer this step is not for
        if isinstance(step, (TextStep, ReasoningStep)):
            kind = ItemKind.ASSISTANT if isinstance(step, TextStep) else ItemKind.REASONING
            chunk = step.chunk or script.chunk
            delay = script.delay_ms if step.delay_ms is None else step.delay_ms
            await self._stream(turn, item_id, kind, turn.render(step.text), agent_id, chunk, delay)
        elif isinstance(step, ToolStep):
            await self._tool(turn, step, item_id, agent_id)
        elif isinstance(step, QuestionStep):
            await self._question(turn, step, item_id, agent_id)
        elif isinstance(step, FormStep):
            await self._form(turn, step, item_id, agent_id)
        elif isinstance(step, PlanStep):
            await self._plan(turn, step, item_id, agent_id)
        elif isinstance(step, SubagentStep):
            await self._subagent(turn, step, item_id)
        elif isinstance(step, TodosStep):
            todos = [Todo(id=t.id or str(i), title=turn.render(t.title), status=t.status, note=turn.render(t.note))
                     for i, t in enumerate(step.todo, 1)]
            self._emit(TodosEvent(todos=TodoList(todos=todos)))
            await trio.lowlevel.checkpoint()
        elif isinstance(step, UsageStep):
            self._usage(step)
            await trio.lowlevel.checkpoint()
        elif isinstance(step, ContextStep):
            self._emit(ContextEvent(context=Context(used=step.used, limit=step.limit, prompt=step.prompt,
                                                    cached=step.cached)))
            await trio.lowlevel.checkpoint()
        elif isinstance(step, TitleStep):
            self._record.title = turn.render(step.title)
            self._emit(TitleEvent(title=self._record.title))
            await trio.lowlevel.checkpoint()
        elif isinstance(step, FailStep):
            raise _TurnFailed(turn.render(step.error))
        elif isinstance(step, SleepStep):
            await trio.sleep(step.ms / 1000)
        elif isinstance(step, UnknownEventStep):
            self._emit(runtime_output.unknown(self._provider.name, step.type, step.data))
            await trio.lowlevel.checkpoint()
        elif isinstance(step, WaitStep):
            if step.until == "cancel":
                await trio.sleep_forever()
            while len(turn.steers) <= turn.steers_consumed:
                await turn.steered.wait()
            turn.steers_consumed = len(turn.steers)
        else:  # pragma: no cover - the schema admits no other kind
            raise AssertionError(f"unknown step {step!r}")

    async def _stream(self, turn: _Turn, item_id: str, kind: ItemKind, text: str, agent_id: str,
                      chunk: int, delay_ms: int) -> None:
        """DeltaEvents of ``chunk`` characters ``delay_ms`` apart, then the whole item."""
        started = utcnow()
        sofar = ""
        for start in range(0, len(text), chunk):
            if start:
                await trio.sleep(delay_ms / 1000)
            piece = text[start : start + chunk]
            sofar += piece
            self._emit(DeltaEvent(delta=Delta(item_id=item_id, kind=kind, text=piece, agent_id=agent_id)))
            # Tracked (not emitted) so a cancel can finish the item with its text so far.
            turn.live[(agent_id, item_id)] = Item(id=item_id, kind=kind, text=sofar, time=started, agent_id=agent_id)
        await trio.lowlevel.checkpoint()
        self._put(turn, Item(id=item_id, kind=kind, text=text, time=started, ended_at=utcnow(), agent_id=agent_id))

    async def _echo(self, turn: _Turn, echo: bool | str, default: str, item_id: str, agent_id: str) -> None:
        if echo is False or echo == "":
            return
        template = default if echo is True else echo
        script = turn.script.script
        await self._stream(turn, item_id, ItemKind.ASSISTANT, turn.render(template), agent_id,
                           script.chunk, script.delay_ms)

    async def _ask(self, turn: _Turn, interaction: Interaction) -> _Pending:
        """Emit a pending interaction and wait for respond(); {answer} becomes its resolution."""
        pending = _Pending(interaction)
        turn.pending[interaction.id] = pending
        self._emit(InteractionEvent(interaction=interaction))
        await pending.done.wait()
        turn.answer = pending.text
        return pending

    # ------------------------------------------------------------------ step kinds

    async def _tool(self, turn: _Turn, step: ToolStep, item_id: str, agent_id: str) -> None:
        shown = step.command if step.command is not None else turn.render(step.input)
        call = ToolCall(name=step.name, status=ToolStatus.RUNNING, title=turn.render(step.title) or shown or step.name,
                        input=turn.render(step.input) or shown)
        item = Item(id=item_id, kind=ItemKind.TOOL, tool=call, time=utcnow(), agent_id=agent_id)
        if step.permission and step.name not in self._record.allowed_tools:
            item = msgspec.structs.replace(item, tool=msgspec.structs.replace(call, status=ToolStatus.PENDING))
            self._put(turn, item, live=True)
            pending = await self._ask(turn, Interaction(
                id=f"{item_id}-permission", kind=InteractionKind.PERMISSION, title=f"Allow {step.name}?",
                detail=shown, options=_permission_options(step.name), time=utcnow(), agent_id=agent_id,
                tool_call_id=item_id))
            decision = pending.answer.decision if pending.answer else "reject"
            turn.outcomes["permission"] = "rejected" if decision == "reject" else "allowed"
            if decision == "reject":
                denied = msgspec.structs.replace(call, status=ToolStatus.FAILED, output="denied")
                self._put(turn, msgspec.structs.replace(item, tool=denied, ended_at=utcnow()))
                return
            if decision == "allow_always":
                self._record.allowed_tools.append(step.name)
        elif step.permission:
            turn.outcomes["permission"] = "allowed"  # allowed for the conversation earlier
        item = msgspec.structs.replace(item, tool=call)
        self._put(turn, item, live=True)
        whole = ""
        if step.command is not None:
            code, output, whole = await self._run_command(turn, item, step.command)
        else:
            await trio.sleep(step.duration_ms / 1000)
            code, output = step.exit_code, turn.render(step.output)
        done = msgspec.structs.replace(call, status=ToolStatus.COMPLETED if code == 0 else ToolStatus.FAILED,
                                       output=output, exit_code=code)
        for event in runtime_output.whole_output(done, whole, item_id, agent_id):
            self._emit(event)
        self._put(turn, msgspec.structs.replace(item, tool=done, ended_at=utcnow()))

    async def _run_command(self, turn: _Turn, item: Item, command: str) -> tuple[int | None, str, str]:
        """Run ``bash -c command`` in the workdir in its own process group.

        Emits the running item with its output tail at most every 0.2 s.
        Returns (exit code, output bounded to its last MAX_OUTPUT_BYTES, the whole
        output when that bound cut it, else ""). On
        cancel the group gets SIGTERM, then SIGKILL after KILL_GRACE.
        """
        out = _Output()
        changed = trio.Event()
        ticking = trio.CancelScope()

        async def ticker() -> None:
            # First update at once, then at most one per interval, and the last one too.
            nonlocal changed
            with ticking:
                while True:
                    await changed.wait()
                    changed = trio.Event()
                    assert item.tool is not None
                    tool = msgspec.structs.replace(item.tool, tail=list(out.tail))
                    self._put(turn, msgspec.structs.replace(item, tool=tool), live=True)
                    await trio.sleep(TAIL_EMIT_INTERVAL)

        async def pump(stream: trio.abc.ReceiveStream, err: bool) -> None:
            partial_line = b""
            async for chunk in stream:
                out.add(chunk)
                partial_line += chunk
                *lines, partial_line = partial_line.split(b"\n")
                while len(partial_line) > 4 * MAX_TAIL_LINE_BYTES:  # no newline for a long while
                    lines.append(partial_line[: 4 * MAX_TAIL_LINE_BYTES])
                    partial_line = partial_line[4 * MAX_TAIL_LINE_BYTES :]
                for line in lines:
                    out.line(line, err)
                if lines:
                    changed.set()
            if partial_line:
                out.line(partial_line, err)

        try:
            argv = procs.launch_argv(["bash", "-c", command], state_dir=self._provider.state_dir, what="script tool")
            from agentd import runtime_env

            # As every runtime's: agentd's environment less other providers' keys, plus [providers.script.env].
            env = {**runtime_env.environ(self._provider.name), **self._provider.config.env}
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=self.workdir, start_new_session=True, env=env)
        except OSError as exc:
            return None, f"could not start bash: {exc}", ""
        self._tool_keepers.add(proc.pid)
        try:
            async with trio.open_nursery() as nursery:
                assert proc.stdout is not None and proc.stderr is not None
                nursery.start_soon(pump, proc.stdout, False)
                nursery.start_soon(pump, proc.stderr, True)
                nursery.start_soon(ticker)
                await proc.wait()
                ticking.cancel()
                # A background child may hold the pipes open; do not wait on it for long.
                nursery.cancel_scope.deadline = trio.current_time() + PIPE_GRACE
        finally:
            with trio.CancelScope(shield=True):
                await _stop_group(proc)
                self._tool_keepers.discard(proc.pid)
                procs.ended(proc.pid, self._provider.state_dir)
            if (item.agent_id, item.id) in turn.live:
                # A cancel finishes the live item: let it keep the output so far.
                assert item.tool is not None
                turn.live[(item.agent_id, item.id)] = msgspec.structs.replace(
                    item, tool=msgspec.structs.replace(item.tool, output=out.text()))
        return proc.returncode, out.text(), out.whole_text()

    async def _question(self, turn: _Turn, step: QuestionStep, item_id: str, agent_id: str) -> None:
        question = Question(text=turn.render(step.text), header=step.header, choices=list(step.choices),
                            multiple=step.multiple, custom=step.custom)
        await self._ask(turn, Interaction(
            id=f"{item_id}-question", kind=InteractionKind.QUESTION, title=step.title or step.header or "Question",
            questions=[question], time=utcnow(), agent_id=agent_id))
        turn.outcomes["question"] = "answered"
        await self._echo(turn, step.echo, "You answered: {answer}", item_id, agent_id)

    async def _form(self, turn: _Turn, step: FormStep, item_id: str, agent_id: str) -> None:
        questions = [_form_question(f, turn) for f in step.field]
        await self._ask(turn, Interaction(
            id=f"{item_id}-form", kind=InteractionKind.QUESTION, title=turn.render(step.title),
            detail=turn.render(step.detail), questions=questions, elicitation=Elicitation(mode="form", source="script"),
            time=utcnow(), agent_id=agent_id))
        turn.outcomes["form"] = "answered"
        await self._echo(turn, step.echo, "Thanks, I got: {answer}", item_id, agent_id)

    async def _plan(self, turn: _Turn, step: PlanStep, item_id: str, agent_id: str) -> None:
        iid = f"{item_id}-plan"
        pending = await self._ask(turn, Interaction(
            id=iid, kind=InteractionKind.PLAN_REVIEW, title=turn.render(step.title),
            plan=PlanReview(request_id=iid, summary=turn.render(step.summary), content=turn.render(step.content),
                            actions=list(step.actions), recommended=step.recommended),
            time=utcnow(), agent_id=agent_id))
        plan = pending.answer.plan if pending.answer else None
        turn.outcomes["plan"] = "approved" if plan is not None and plan.action else "feedback"
        await self._echo(turn, step.echo, "Plan decision: {answer}", item_id, agent_id)

    async def _subagent(self, turn: _Turn, step: SubagentStep, item_id: str) -> None:
        """A ``task`` tool item running a subagent whose items carry its id."""
        started = utcnow()
        call = ToolCall(name="task", title=turn.render(step.description) or step.name, input=turn.render(step.description))
        task = Item(id=item_id, kind=ItemKind.TOOL, tool=call, time=started)
        self._put(turn, task, live=True)
        sub = Subagent(id=f"agent-{item_id}", name=step.name, status=SubagentStatus.RUNNING,
                       description=turn.render(step.description), model=step.model, parent_tool_call_id=item_id,
                       started_at=started, runs=[SubagentRun(status=SubagentStatus.RUNNING, started_at=started)])
        self._put_subagent(turn, sub)
        steps: list[Any] = list(step.step)
        if step.text:
            steps.append(TextStep(text=step.text))
        with trio.CancelScope() as scope:
            turn.subagent_scopes[sub.id] = scope
            try:
                await self._steps(turn, steps, item_id, sub.id)
            finally:
                turn.subagent_scopes.pop(sub.id, None)
        report = next((i.text for i in reversed(self._record.items)
                       if i.agent_id == sub.id and i.kind is ItemKind.ASSISTANT), "")
        tools = sum(isinstance(s, ToolStep) for s in step.step)
        sub = msgspec.structs.replace(sub, tool_calls=tools)
        now = utcnow()
        if scope.cancelled_caught:
            # Only this subagent was stopped: its streamed items end as they are, the turn goes on.
            for key in [k for k in turn.live if k[0] == sub.id]:
                item = turn.live.pop(key)
                self._put(turn, msgspec.structs.replace(item, ended_at=now))
            self._put_subagent(turn, _end_subagent(sub, SubagentStatus.CANCELLED, now, ""))
            done = msgspec.structs.replace(call, status=ToolStatus.FAILED, output="the subagent was cancelled")
        elif step.fail:
            error = turn.render(step.fail)
            self._put_subagent(turn, _end_subagent(sub, SubagentStatus.FAILED, now, error))
            done = msgspec.structs.replace(call, status=ToolStatus.FAILED, output=error)
        else:
            self._put_subagent(turn, _end_subagent(sub, SubagentStatus.COMPLETED, now, ""))
            done = msgspec.structs.replace(call, status=ToolStatus.COMPLETED, output=report)
        self._put(turn, msgspec.structs.replace(task, tool=done, ended_at=now))

    def _usage(self, step: UsageStep) -> None:
        self._emit(TokensEvent(tokens=TokenUsage(
            model=step.model or self.model, input=step.input, output=step.output, cache_read=step.cache_read,
            cache_write=step.cache_write, duration_ms=step.duration_ms, cost_usd=step.cost_usd)))
        old = self._record.usage or Usage()
        cost = old.cost_usd
        if step.cost_usd is not None:
            cost = (cost or 0.0) + step.cost_usd
        self._record.usage = Usage(ai_units=old.ai_units + step.ai_units, cost_usd=cost)
        self._emit(UsageEvent(usage=self._record.usage))


# --------------------------------------------------------------------------- helpers


def _end_subagent(sub: Subagent, status: SubagentStatus, now: _dt.datetime, error: str) -> Subagent:
    runs = list(sub.runs)
    if runs:
        runs[-1] = msgspec.structs.replace(runs[-1], status=status, ended_at=now)
    return msgspec.structs.replace(sub, status=status, ended_at=now, error=error, runs=runs)


def _form_question(f: FormField, turn: _Turn) -> Question:
    choices, values = list(f.choices), list(f.values)
    if f.type == "boolean" and not choices:
        choices, values = ["Yes", "No"], ["true", "false"]
    field = Field(name=f.name, type=f.type, required=f.required, values=values, format=f.format,
                  minimum=f.minimum, maximum=f.maximum, min_length=f.min_length, max_length=f.max_length,
                  min_items=f.min_items, max_items=f.max_items)
    return Question(text=turn.render(f.text or f.name), header=f.header, choices=choices,
                    multiple=f.type == "array", custom=not choices, field=field)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _resolve(interaction: Interaction, answer: Answer) -> tuple[InteractionState, str]:
    """The state and display resolution of a validated answer."""
    if interaction.kind is InteractionKind.PERMISSION:
        option = next(o for o in interaction.options if o.id == answer.decision)
        return (InteractionState.REJECTED if option.reject else InteractionState.ANSWERED), option.id
    if interaction.kind is InteractionKind.PLAN_REVIEW:
        assert answer.plan is not None
        if answer.plan.action is not None:
            return InteractionState.ANSWERED, answer.plan.action
        return InteractionState.REJECTED, answer.plan.feedback.strip()
    if answer.cancel:
        return InteractionState.REJECTED, "cancelled"
    if answer.reject:
        return InteractionState.REJECTED, "declined"
    if interaction.elicitation is not None:
        parts = []
        for q, values in zip(interaction.questions, answer.answers):
            assert q.field is not None
            value, given = q.field_value(values)
            if given:
                parts.append(f"{q.field.name}={_show(value)}")
        return InteractionState.ANSWERED, "; ".join(parts)
    return InteractionState.ANSWERED, " / ".join(", ".join(v for v in values if v) for values in answer.answers)


class _Output:
    """A command's output: the last MAX_OUTPUT_BYTES (display), the whole up to the
    64 MiB message ceiling (kept beside the journal), and a tail of bounded lines."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.whole = bytearray()
        self.cut = 0
        self.tail: collections.deque[OutputLine] = collections.deque(maxlen=MAX_TAIL_LINES)

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.whole) < runtime_output.MAX_MESSAGE_BYTES:
            self.whole += chunk[: runtime_output.MAX_MESSAGE_BYTES - len(self.whole)]
        extra = len(self.buf) - MAX_OUTPUT_BYTES
        if extra > 0:
            del self.buf[:extra]
            self.cut += extra

    def line(self, raw: bytes, err: bool) -> None:
        text = runtime_output.decode(raw.rstrip(b"\r"))
        text = text.encode()[:MAX_TAIL_LINE_BYTES].decode("utf-8", "ignore")
        self.tail.append(OutputLine(text=text, err=err))

    def text(self) -> str:
        body = runtime_output.decode(bytes(self.buf)).rstrip("\n")
        return f"[{self.cut} earlier bytes cut]\n{body}" if self.cut else body

    def whole_text(self) -> str:
        return runtime_output.decode(bytes(self.whole)).rstrip("\n") if self.cut else ""


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _stop_group(proc: trio.Process) -> None:
    """Stop what is left of the command's process group and reap bash. Not cancellable."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        with trio.move_on_after(KILL_GRACE):
            await proc.wait()
        if proc.returncode is None:
            procs.kill(proc.pid)  # the keeper kills the group and what left it
            with trio.move_on_after(1.0):
                await proc.wait()
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGKILL)
    else:
        # bash is gone; background children it left would otherwise outlive the tool call
        _signal_group(proc.pid, signal.SIGTERM)
    await proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()
