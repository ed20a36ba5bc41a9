"""A cut at a known line, read as code when its finding is decided (#54 item 1): what is rewritten, and
what is left to the words (no code where the line is not plain, never "remove the `.detach()`" where the
next op needs NumPy)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch
from torch import nn

from leafwatch.detectors import causes
from leafwatch.detectors.cut_fixes import CutFix, cut_fix, grad_off
from leafwatch.report.reasons import Place
from leafwatch.report.words import Members


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_detach_is_removed_and_two_on_one_line_are_left_to_the_words(tmp_path: Path) -> None:
    path = _file(tmp_path, """\
        def forward(self, x):
            h = self.fc(x).detach()
            return self.a(h.detach()) + self.b(h.detach())
        """)
    fixed = cut_fix("`.detach()`", path, 2)
    assert fixed is not None and fixed.corrected == "h = self.fc(x)" and not fixed.numpy
    assert (fixed.edit.start, fixed.edit.end, fixed.edit.text) == (2, 2, "    h = self.fc(x)\n")
    assert cut_fix("`.detach()`", path, 3) is None  # which one? the words say where


def test_a_detach_that_feeds_numpy_is_never_removed_alone(tmp_path: Path) -> None:
    path = _file(tmp_path, """\
        def forward(self, x):
            h = torch.tensor(self.fc(x).detach().cpu().numpy())
            g = torch.from_numpy(np.clip(h.detach().numpy(), a_min=0, a_max=1))
            k = torch.from_numpy(np.interp(h.detach().numpy(), xs, ys))
        """)
    plain = cut_fix("`.detach()`", path, 2)
    assert plain == CutFix(numpy=True)  # a round trip with no NumPy op: no code
    clipped = cut_fix("`.detach()`", path, 3)
    assert clipped.corrected == "g = torch.clamp(h, min=0, max=1)" and clipped.twin == ("clip", "clamp")
    assert cut_fix("`.detach()`", path, 4) == CutFix(numpy=True, missing="interp")
    m = Members(["fc.weight"], [causes.Detached(op="`.detach()`", place=Place(path, 2, "forward"), module="fc",
                                                fixed=plain)], "")
    words = causes.Detached(op="`.detach()`", place=Place(path, 2, "forward"), module="fc", fixed=plain).words(m)
    assert "remove the `.detach()` at" not in words.fix and words.remedy.applicability == "words"
    assert words.fix.startswith("keep the values a tensor at model.py:2: use torch ops on the tensor itself")


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(2, 2)

    def forward(self, x):
        with torch.no_grad():
            a = self.enc(x)
        with torch.no_grad():
            b = self.enc(x)
        return a + b


def test_a_module_called_under_two_no_grad_blocks_is_left_to_the_words() -> None:
    model = _Blocks()
    assert grad_off("enc", {"": model, "enc": model.enc}) is None


def test_a_cut_by_grad_mode_off_undoes_its_block_or_drops_the_decorator_of_the_method_called(tmp_path: Path) -> None:
    path = _file(tmp_path, """\
        class Net(nn.Module):
            def forward(self, x):
                h = torch.relu(self.fc1(x))
                with torch.no_grad():
                    h = h / h.norm(dim=-1, keepdim=True)
                return self.fc2(self.norm(h))

            @torch.no_grad()
            def norm(self, h):
                return h / h.norm()
        """)
    block = cut_fix("`torch.no_grad()`", path, 4)
    assert (block.how, block.corrected) == ("block", "h = h / h.norm(dim=-1, keepdim=True)")
    assert (block.edit.start, block.edit.end, block.edit.text) == (4, 5, "        h = h / h.norm(dim=-1, keepdim=True)\n")
    decorator = cut_fix("`torch.no_grad()`", path, 6)
    assert (decorator.how, decorator.function) == ("decorator", "norm")
    assert (decorator.edit.start, decorator.edit.end, decorator.edit.text) == (8, 9, "    def norm(self, h):\n")
    m = Members(["fc1.weight"], [causes.Detached(op="`torch.no_grad()`", place=Place(path, 6, "forward"),
                                                 module="fc1", fixed=decorator)], "")
    words = m.first.words(m)
    assert words.fix.startswith("drop the `torch.no_grad()` decorator of `norm`, which the line at model.py:6 calls")
    assert words.remedy.code == "def norm(self, h):\n    return h / h.norm()"


class _Distilled(nn.Module):
    """A teacher run under no_grad on purpose, and the student's encoder in the same block by mistake."""

    def __init__(self) -> None:
        super().__init__()
        self.teacher, self.encoder, self.head = nn.Linear(2, 2).requires_grad_(False), nn.Linear(2, 2), nn.Linear(2, 1)

    def forward(self, x):
        with torch.no_grad():
            target = self.teacher(x)
            h = self.encoder(x)
            target = target.softmax(-1)
        return self.head(h), target


def test_only_the_statement_that_calls_the_module_leaves_a_block_that_holds_more() -> None:
    model = _Distilled()
    off = grad_off("encoder", {"": model, "encoder": model.encoder})
    line = _Distilled.forward.__code__.co_firstlineno + 1
    assert (off.how, off.corrected, off.edit.start, off.edit.end) == ("block", "h = self.encoder(x)", line, line + 3)
    assert off.edit.text == ("        with torch.no_grad():\n            target = self.teacher(x)\n"
                             "        h = self.encoder(x)\n"
                             "        with torch.no_grad():\n            target = target.softmax(-1)\n")


def test_a_round_trip_over_three_statements_becomes_the_torch_op_unless_an_array_is_used_further_on(
        tmp_path: Path) -> None:
    path = _file(tmp_path, """\
        def forward(self, x):
            x = self.fc(x)
            x = x.detach().cpu().numpy()
            x = np.clip(x, a_min=0, a_max=6)
            x = torch.from_numpy(x).float()
            return self.head(x)

        def other(self, h):
            a = h.detach().numpy()
            b = np.tanh(a)
            h = torch.from_numpy(b)
            return self.head(h), a.mean()

        def third(self, h):
            a = h.detach().numpy()
            a = np.interp(a, xs, ys)
            h = torch.from_numpy(a)
            return self.head(h)
        """)
    fixed = cut_fix("`.detach()`", path, 3)
    assert (fixed.corrected, fixed.twin) == ("x = torch.clamp(x, min=0, max=6).float()", ("clip", "clamp"))
    assert (fixed.edit.start, fixed.edit.end, fixed.edit.text) == (3, 5, "    x = torch.clamp(x, min=0, max=6).float()\n")
    assert cut_fix("`.detach()`", path, 9) == CutFix(numpy=True)  # `a` is read further on: words only
    assert cut_fix("`.detach()`", path, 15) == CutFix(numpy=True, missing="interp")  # named in the words
