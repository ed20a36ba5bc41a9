"""The optimizer built after the last change to the model (``leafwatch.detectors.rebuild``), read from a script's source:
where the statements move or are repeated, and where no rebuild is given (the caller keeps ``add_param_group`` of the
new tensors). The patched scripts that train are in tests/integrations/test_fixes_train.py."""

from __future__ import annotations

import linecache
import textwrap
from pathlib import Path

import pytest

from leafwatch.detectors import rebuild
from leafwatch.detectors.fixes import statement_span
from leafwatch.report.words import Edit


def _source(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    linecache.checkcache(str(path))
    return str(path)


def _rebuilt(path: str, optimizer_line: int, change_line: int, variable: str = "optimizer") -> rebuild.Rebuilt | None:
    at = statement_span(f"{path}:{optimizer_line}")
    return rebuild.rebuilt(at, rebuild.after_change(at, [f"{path}:{change_line}"]), variable)


def _applied(path: str, edit: Edit) -> str:
    lines = Path(path).read_text().splitlines(keepends=True)
    if edit.action == "replace":
        lines[edit.start - 1:edit.end] = [edit.text]
    else:
        lines[edit.end:edit.end] = [edit.text]
    return "".join(lines)


def test_the_optimizer_and_its_scheduler_move_below_the_change_in_their_block(tmp_path: Path) -> None:
    path = _source(tmp_path, """\
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7)
        # a new head
        model.fc = nn.Linear(16, 2)
        train(model, optimizer, scheduler)
        """)
    built = _rebuilt(path, 2, 5)
    assert built is not None and built.moved and built.schedulers == ("scheduler",)
    assert _applied(path, built.edit) == textwrap.dedent("""\
        model = Net()
        # a new head
        model.fc = nn.Linear(16, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7)
        train(model, optimizer, scheduler)
        """)
    assert built.shown == ("optimizer = torch.optim.SGD(model.parameters(), lr=0.01); "
                           "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7)")


def test_a_change_in_a_loop_that_trains_gets_the_optimizer_built_again_right_after_it(tmp_path: Path) -> None:
    path = _source(tmp_path, """\
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for fold in range(3):
            if fold:
                model = copy.deepcopy(base)
            optimizer.step()
        """)
    built = _rebuilt(path, 1, 4)
    assert built is not None and not built.moved
    assert built.edit == Edit(path, 4, 4, "insert_after", "        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n")


def test_a_loop_that_only_changes_the_model_gets_the_optimizer_below_it(tmp_path: Path) -> None:
    path = _source(tmp_path, """\
        optimizer = torch.optim.AdamW(model.parameters())
        for i in (0, 2):
            model[i] = LoRALinear(model[i])
        optimizer.step()
        """)
    built = _rebuilt(path, 1, 3)
    assert built is not None and built.moved
    assert _applied(path, built.edit).splitlines()[:3] == [
        "for i in (0, 2):", "    model[i] = LoRALinear(model[i])", "optimizer = torch.optim.AdamW(model.parameters())"]


def test_a_change_made_inside_a_function_is_fixed_after_the_call_never_inside_it(tmp_path: Path) -> None:
    path = _source(tmp_path, """\
        def reshape(net):
            net.fc = nn.Linear(16, 2)


        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        reshape(model)
        """)
    at = statement_span(f"{path}:5")
    change = rebuild.after_change(at, [f"{path}:2", f"{path}:6"])  # the registration's frames, innermost first
    assert change is not None and change.start == 6
    built = rebuild.rebuilt(at, change, "optimizer")
    assert built is not None and built.moved and built.edit.start == 5 and built.edit.end == 6


@pytest.mark.parametrize(("text", "why"), [
    ("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\noptimizer.load_state_dict(state)\nmodel.fc = head()\n",
     "a resumed run: the state must be kept"),
    ("optimizer = torch.optim.SGD(model.parameters(), lr=lr)\nlr = 0.01\nmodel.fc = head()\n",
     "a value the optimizer's statement reads is set again before the change"),
    ("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nstudent = copy.deepcopy(model)\nstudent.fc = head()\n",
     "running the optimizer's statement again would not see the change"),
    ("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\noptimizer.step()\nmodel.fc = head()\n",
     "the optimizer is used before the change"),
    ("opts = [torch.optim.SGD(model.parameters(), lr=0.1)]\nmodel.fc = head()\n", "not a plain assignment of the variable"),
])
def test_no_rebuild_where_it_would_not_be_true(tmp_path: Path, text: str, why: str) -> None:
    path = _source(tmp_path, text)
    assert _rebuilt(path, 1, 3 if text.count("\n") == 3 else 2, variable="optimizer" if "opts" not in text
                    else "opts[0]") is None, why
