"""A resume says that the iterators setup() made start from their beginning, and which globals they set again.

A snapshot keeps the weights, the optimizer, the step, the RNG states and the counters in module globals, not
where an iterator was: there is no general way to save a generator's place. So a run resumed at step 654
reads, at step 655, the batch a fresh start reads first, while the `resume` event said only that it had put
back `train.epoch = 4`; and the generator `batches()` (pytorch/examples' dcgan, ported: `global epoch` and
`for epoch in range(opt.niter):` inside it) set `epoch` to 0 again at its first `next()`, so the claim did not
hold for one step. Both are said now. A generator that reads a loader whose place the resume put back
(loader_places.py) is said to start over with its own variables only.

Iterators are looked for through the objects of the state too (minGPT's Trainer keeps `self.data_iter`): one
level down, the resume of a ported minGPT read a fresh start's first batches again with no note. A DataLoader's
iterator with workers hands them their first batches as it is made, so its order was drawn in setup(), before the
resume put the random states back: it is said to read a fresh start's batches, not to go on from those states.
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import io
import os
import textwrap
from collections.abc import Callable, Iterator
from types import CodeType, GeneratorType
from typing import Any

import torch

from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from workbench.engine.hotswap.syntax_trees import parse
from workbench.engine.loader_places import is_stateful, loaders_read_by
from workbench.engine.state_walk import Namespaces, generator_inputs, reachable, top_values


def fresh_iterator_notes(state: Any, step: int, put_back: list[str],
                         in_project: Callable[[str], str | None], placed: dict[int, str] | None = None,
                         rebuild: bool = False, reshuffled: frozenset[int] = frozenset(),
                         namespaces: Namespaces = ()) -> tuple[str, ...]:
    """The resume's notes (a rebuild's with `rebuild`: its new setup() made the iterators). `put_back`: the
    qualified globals the resume set (`train.epoch`); `in_project`: a file's path relative to the project, or None
    outside it; `placed`: the stateful loaders given back their place (loader_places.py; by id, their paths), of
    which `reshuffled` were given a count of batches, not an order; `namespaces`: the project's module globals,
    whose iterators a script made at import (a resume's only: a rebuild does not make them again)."""
    placed = placed or {}
    # A project object whose own counters the resume put back (`state['rows'].pos`, training_globals.py) goes on.
    found = [(label, value) for label, value in iterators_in(state, () if rebuild else namespaces)
             if not any(name.startswith(f"{label}.") for name in put_back)]
    if not found:
        return ()
    given = frozenset(placed)
    read = {label: [loader for loader in loaders_read_by(value, given) if id(loader) in placed]
            for label, value in found if isinstance(value, GeneratorType)}
    reading = {label: [placed[id(loader)] for loader in loaders] for label, loaders in read.items()}
    fresh = [(label, value) for label, value in found if not reading.get(label)]
    drawn = [(label, value) for label, value in fresh if isinstance(value, _MultiProcessingDataLoaderIter)]
    fresh = [(label, value) for label, value in fresh if not isinstance(value, _MultiProcessingDataLoaderIter)]
    seeded = [(label, value, loaders) for label, value in fresh
              if (loaders := _loaders_seeding_from_global(value) + [(made, None) for made in
                                                                    _loaders_made_inside(value, in_project)])]
    fresh = [(label, value) for label, value in fresh if not any(value is other for _, other, _ in seeded)]
    notes = []
    kept = ("A rebuild carries the weights, the optimizers and their LR schedules, counters, the tensors training "
            "changed, loaders' places and random streams" if rebuild else
            "A snapshot keeps the weights, the optimizer, the step, the RNG states and counters in globals")

    def starts_over(iterators: list[tuple[str, Any]], how: str, then: str) -> str:
        shown = "; ".join(f"{label} ({_what(value, in_project)})" for label, value in iterators)
        made = "the new setup() made" if rebuild else "setup() just made"
        if not any(label.startswith("state") for label, _ in iterators):
            made = "the import just made"  # a module global's: a script's `train_loader = cycle(...)`
        return (f"{shown}: the one {made}, so it starts from "
                f"its beginning, not where step {step} left it{how}. {kept}, not an iterator's place: {then}")

    if drawn:
        notes.append(starts_over(
            drawn, ", in the order drawn as setup() made it (its workers were handed their first batches then): it "
            "reads again the batches a fresh start reads first",
            "make the iterator in step() or in a generator, or read a torchdata StatefulDataLoader, whose place goes on"))
    for label, value, loaders in seeded:
        shuffled = {shuffles for _, shuffles in loaders}
        drawn_now = ("its seed and its shuffled order" if True in shuffled else
                     "its seed (a shuffling sampler's order too)" if None in shuffled else "its seed")
        notes.append(starts_over(
            [(label, value)], f"; and it reads {', '.join(path for path, _ in loaders)}, whose new iterator draws "
            f"{drawn_now} from the global random generator when it is made, here after the RNG states were "
            f"{'carried' if rebuild else 'put back'}, where the run made its first at its start: every random draw "
            "after it (dropout, a dataset's random crops) differs from the run that never stopped",
            "give the DataLoader a generator of its own (`generator=torch.Generator()`), which it then draws these "
            "from, or read a torchdata StatefulDataLoader, whose place goes on"))
    for label, value in list(fresh):
        if loaders := _plain_loaders_drawing_from(value, placed):
            fresh.remove((label, value))
            notes.append(starts_over(
                [(label, value)], f"; and it reads {', '.join(loaders)}, whose new epoch draws its order from the "
                f"loader's own generator, {'carried' if rebuild else 'put back'} as step {step} left it (so a new "
                f"order, not the rest of the one step {step} was in)",
                "read a torchdata StatefulDataLoader (the same arguments), whose place goes on"))
    if fresh:
        notes.append(starts_over(
            fresh, "", "one that walks a dataset in order or by epochs starts it over; one that draws at random goes "
            f"on from the {'carried' if rebuild else 'restored'} RNG states (a torchdata StatefulDataLoader it reads "
            "would go on from its place)"))
    for label, value in found:
        if reading.get(label):
            streams = all(isinstance(loader, torch.Generator) for loader in read[label])
            what = "the random stream it draws from" if streams else "the loader it reads"
            where = (f"how far into its epoch step {step} left it (in another order: see its note)"
                     if any(id(loader) in reshuffled for loader in read[label]) else f"where step {step} left it")
            own = _own_variables(value)
            starts = (f"so its own variables ({', '.join(own)}) start over, while" if own else
                      "and")  # `global epoch; while epoch < EPOCHS: yield from loader`: nothing of its own
            notes.append(f"{label} ({_what(value, in_project)}): the one setup() just made, {starts} {what}, "
                         f"{', '.join(reading[label])}, goes on from {where}")
    for label, value in found:
        reset = _globals_set_by(value, put_back)
        if reset:
            notes.append(f"{', '.join(reset)} put back from the snapshot, but {label} sets it again when it starts "
                         f"({value.__qualname__}() assigns it), so the value it had at step {step} holds only until "
                         "then")
    return tuple(notes)


def _is_data_iterator(value: Any) -> bool:
    return isinstance(value, Iterator) and not isinstance(value, io.IOBase)  # an open file is no data's place


def iterators_in(state: Any, namespaces: Namespaces = ()) -> list[tuple[str, Any]]:
    """The iterators in what setup() returned, by the path the user's code reaches them by: at its top
    (`state['batches']`) and inside its objects (`state['trainer'].data_iter`), not inside a loader; and those the
    project's module globals hold (`train.train_loader = cycle(DataLoader(...))`, made at import)."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for label, value in top_values(state):
        found.extend(reachable(value, label, matches=_is_data_iterator, seen=seen, depth=1, stop_at=(DataLoader,)))
    for module, names in namespaces:
        for name, value in list(names.items()):
            if not name.startswith("__") and id(value) not in seen and isinstance(value, (GeneratorType, _BaseDataLoaderIter)):
                seen.add(id(value))
                found.append((f"{module}.{name}", value))
    return found


def _loaders_seeding_from_global(value: Any) -> list[tuple[str, bool]]:
    """The plain DataLoaders a generator that has not begun reads (given, closed over, or a module global it names)
    that have no generator of their own: each of its new iterators draws from the global random generator. With each,
    whether its order is drawn there too (a RandomSampler's, not a DistributedSampler's, which comes from its seed and
    epoch)."""
    if not isinstance(value, GeneratorType) or inspect.getgeneratorstate(value) != inspect.GEN_CREATED:
        return []
    inputs = generator_inputs(value, "")
    frame_globals = value.gi_frame.f_globals if value.gi_frame is not None else {}
    inputs += [(name, frame_globals[name]) for name in sorted(_globals_loaded(value.gi_code))
               if isinstance(frame_globals.get(name), DataLoader)]
    seen: set[int] = {id(value)}
    found = [(path, _shuffles_from_global(loader)) for where, input_value in inputs
             for path, loader in reachable(input_value, where, matches=lambda o: isinstance(o, DataLoader), seen=seen,
                                           depth=1, stop_at=(DataLoader,), into_generators=True)
             if getattr(loader, "generator", None) is None and not is_stateful(loader)]
    return list(dict.fromkeys(found))


def _shuffles_from_global(loader: DataLoader) -> bool:
    """Whether the loader's order is drawn from the global generator as each epoch begins (`shuffle=True` with no
    generator: a RandomSampler without one, given directly or inside its batch sampler)."""
    sampler = getattr(loader.batch_sampler, "sampler", None) or loader.sampler
    return isinstance(sampler, RandomSampler) and sampler.generator is None


def _plain_loaders_drawing_from(value: Any, placed: dict[int, str]) -> list[str]:
    """The plain DataLoaders a generator that has not begun reads whose own `generator=` the resume (or rebuild) gave
    its state back (loader_places.find_loaders: `batches(loader).generator`), by path."""
    if not isinstance(value, GeneratorType) or inspect.getgeneratorstate(value) != inspect.GEN_CREATED:
        return []
    seen: set[int] = {id(value)}
    return [path for where, input_value in generator_inputs(value, "")
            for path, loader in reachable(input_value, where, seen=seen, depth=1, stop_at=(DataLoader,),
                                          into_generators=True,
                                          matches=lambda o: isinstance(o, DataLoader) and id(o.generator) in placed)]


def _loaders_made_inside(value: Any, in_project: Callable[[str], str | None]) -> list[str]:
    """The plain DataLoaders a generator that has not begun makes in its own body with no `generator=` (the loop
    README's porting advice gives: `loader = DataLoader(...)`, then `for epoch ...: for batch in loader: yield`):
    made at its first `next()`, after the resume put the random states back, each draws from the global generator."""
    if not isinstance(value, GeneratorType) or inspect.getgeneratorstate(value) != inspect.GEN_CREATED:
        return []
    try:
        lines, first = inspect.getsourcelines(value.gi_code)
        tree = parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return []
    namespace = value.gi_frame.f_globals if value.gi_frame is not None else {}
    where = in_project(os.path.abspath(value.gi_code.co_filename)) or os.path.basename(value.gi_code.co_filename)
    return [f"the DataLoader it makes ({where}:{first + node.lineno - 1})" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _plain_loader_class(_resolved(node.func, namespace))
            and not any(keyword.arg in ("generator", None) for keyword in node.keywords)]  # None: `**kwargs` may give one


def _resolved(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """What `DataLoader` or `torch.utils.data.DataLoader` names in the generator's module, or None."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id, getattr(builtins, node.id, None))
    if isinstance(node, ast.Attribute):
        return getattr(_resolved(node.value, namespace), node.attr, None)
    return None


def _plain_loader_class(value: Any) -> bool:
    """A DataLoader class that cannot say where it is (a torchdata StatefulDataLoader can: its place goes on)."""
    return isinstance(value, type) and issubclass(value, DataLoader) and not callable(getattr(value, "load_state_dict", None))


def _globals_loaded(code: CodeType) -> set[str]:
    return {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}


def _own_variables(value: Any) -> list[str]:
    """A generator's local variables other than its arguments (`epoch` of `for epoch in range(EPOCHS):`), which a
    new one starts over; a generator that keeps its count in a module global (put back by the resume) has none."""
    if not isinstance(value, GeneratorType):
        return []
    code = value.gi_code
    arguments = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + \
        bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return [name for name in (*code.co_varnames[arguments:], *code.co_cellvars) if not name.startswith(".") and name != "_"]


def _what(value: Any, in_project: Callable[[str], str | None]) -> str:
    if isinstance(value, GeneratorType):
        code = value.gi_code
        where = in_project(os.path.abspath(code.co_filename))
        return f"the generator {code.co_qualname}()" + (f", {where}:{code.co_firstlineno}" if where else "")
    return f"a {type(value).__name__}"


def _globals_set_by(value: Any, put_back: list[str]) -> list[str]:
    """The put-back globals that a generator's own code assigns before it reads them (`global epoch` and
    `for epoch in range(...)`), so the snapshot's value is lost at its start; one it reads first (`while True:
    sampler.set_epoch(epoch)` ... `epoch += 1`) goes on from the put-back value."""
    if not isinstance(value, GeneratorType) or inspect.getgeneratorstate(value) != inspect.GEN_CREATED:
        return []
    module = value.gi_frame.f_globals.get("__name__") if value.gi_frame is not None else None
    stored = _stored_globals(value.gi_code)
    return [qualified for qualified in put_back
            if qualified.rpartition(".")[0] == module and qualified.rpartition(".")[2] in stored]


def _stored_globals(code: CodeType) -> set[str]:
    """The globals whose first use in the code (in the order of its instructions, which follows the source's) is
    an assignment."""
    first: dict[str, str] = {}
    for ins in dis.get_instructions(code):
        if ins.opname in ("STORE_GLOBAL", "LOAD_GLOBAL"):
            first.setdefault(ins.argval, ins.opname)
    return {name for name, opname in first.items() if opname == "STORE_GLOBAL"}
