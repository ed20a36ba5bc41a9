"""frames.py: the first frame of user code, for warnings, watch locations and caller names."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable

import pytest

from leafwatch.observe import frames


def test_from_user_code_the_first_user_frame_is_the_caller() -> None:
    here = sys._getframe()
    assert frames.user_frame() is here
    assert next(frames.user_frames()) is here
    assert frames.stacklevel_outside() == 1
    assert frames.caller_location() == f"{__file__}:{here.f_lineno}"


def test_frames_of_a_skipped_folder_are_passed_over(tmp_path) -> None:
    def inner() -> tuple[object, int]:
        return frames.user_frame(skip=(__file__,)), frames.stacklevel_outside(skip=(__file__,))

    # Called from a file of the user's (pytest's own frames above the test are installed code).
    caller = tmp_path / "caller.py"
    caller.write_text("found = inner()\n")
    scope = {"inner": inner}
    exec(compile(caller.read_text(), str(caller), "exec"), scope)
    frame, level = scope["found"]
    assert frame is not None and frame.f_code.co_filename == str(caller)
    assert level == 2  # the caller of the skipped frame


def test_installed_code_and_pseudo_files_are_never_the_users(tmp_path, monkeypatch) -> None:
    """A library in a site-packages folder (skorch, torchrl: no framework of the list) and code
    compiled from a string are passed over; the user's own file is not."""
    library = tmp_path / "site-packages"
    library.mkdir()
    (library / "skorch_like.py").write_text(
        "from leafwatch.observe import frames\n"
        "def fit():\n"
        "    frame = frames.user_frame()  # as a hook leafwatch runs inside the library's loop\n"
        "    return frame.f_code.co_filename if frame is not None else ''\n")
    monkeypatch.syspath_prepend(str(library))
    import skorch_like

    caller = tmp_path / "train.py"
    caller.write_text("found = skorch_like.fit()\npseudo = eval(compile('skorch_like.fit()', '<string>', 'eval'))\n")
    scope = {"skorch_like": skorch_like}
    exec(compile(caller.read_text(), str(caller), "exec"), scope)
    assert scope["found"] == str(caller) and scope["pseudo"] == str(caller)
    # A notebook cell is the user's code, though IPython names it like a pseudo-file.
    cell = "<ipython-input-3-0123456789ab>"
    assert eval(compile("skorch_like.fit()", cell, "eval"), scope) == cell
    assert str(library) + os.sep in frames.installed_dirs()


def test_a_leafwatch_warning_points_at_the_users_line() -> None:
    import torch

    import leafwatch

    with pytest.warns(leafwatch.LeafwatchWarning) as caught:
        unused = leafwatch.watch(torch.ones(1, requires_grad=True).double(), name="scale"); line = sys._getframe().f_lineno  # noqa: E702
    try:
        assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    finally:
        leafwatch.unwatch(unused)


def test_the_frameworks_are_those_imported_and_none_is_imported_here() -> None:
    import os

    import torch

    before = set(sys.modules)
    dirs = frames.framework_dirs()
    assert set(sys.modules) == before
    assert os.path.dirname(os.path.abspath(torch.__file__)) + os.sep in dirs


class _Deprecated:
    """An object whose every read warns, as torch's ``torch.distributed.reduce_op`` does."""

    def __getattribute__(self, name: str) -> object:
        warnings.warn("`_Deprecated` is deprecated", FutureWarning, stacklevel=2)
        return object.__getattribute__(self, name)


class _StillDeprecated(_Deprecated):
    """Its base's ``__getattribute__`` runs all the same."""


class _ClassProperty:
    """``isinstance`` reads ``__class__``: a property there runs at each check."""

    @property
    def __class__(self) -> type:  # type: ignore[override]
        warnings.warn("`_ClassProperty.__class__` runs", FutureWarning, stacklevel=2)
        return _ClassProperty


class _DeprecatedProperty:
    """A deprecated property is not run by ``isinstance`` or ``vars()``: the object is readable."""

    @property
    def old(self) -> int:
        warnings.warn("`_DeprecatedProperty.old` is deprecated", FutureWarning, stacklevel=2)
        return 1


@pytest.mark.parametrize(("make", "expected"), [
    pytest.param(lambda: 1, True, id="int"), pytest.param(lambda: {"a": [1]}, True, id="dict"),
    pytest.param(lambda: None, True, id="None"), pytest.param(lambda: os, True, id="module"),
    pytest.param(lambda: frames.readable, True, id="function"), pytest.param(lambda: int, True, id="class"),
    pytest.param(_DeprecatedProperty, True, id="deprecated-property"),
    pytest.param(_Deprecated, False, id="own-getattribute"),
    pytest.param(_StillDeprecated, False, id="inherited-getattribute"),
    pytest.param(_ClassProperty, False, id="class-property"),
])
def test_readable_passes_over_objects_whose_reads_run_code_of_their_own(make: Callable[[], object],
                                                                         expected: bool) -> None:
    value = make()  # (made here: pytest's parametrize reads its values)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert frames.readable(value) is expected  # reading the class warns nothing, either way


def test_torchs_deprecated_reduce_op_is_not_readable_and_a_module_is() -> None:
    import torch
    import torch.distributed

    assert not frames.readable(torch.distributed.reduce_op)
    assert frames.readable(torch.distributed) and frames.readable(torch.nn.Linear(1, 1))
    assert frames.readable(torch.zeros(1)) and frames.readable(torch.nn.Parameter(torch.zeros(1)))


class _UsersMonitor:
    """A class of the user's that subclasses nothing of leafwatch's: read as any other."""


def test_leafwatchs_own_objects_are_never_read_and_the_users_are() -> None:
    import torch

    import leafwatch

    class Subclass(leafwatch.Monitor):  # the user's subclass of a Monitor is still leafwatch's machinery
        pass

    model = torch.nn.Linear(2, 1)
    for own in (leafwatch.Monitor(model), Subclass(model), leafwatch.Report()):
        assert frames.own(own) and not frames.readable(own), own
    assert not frames.own(_UsersMonitor()) and frames.readable(_UsersMonitor())
    assert not frames.own(model) and not frames.own(frames.readable)  # a function of leafwatch's is a function


def test_the_demos_model_is_the_users_side_of_a_run() -> None:
    from _requirements import require_lightning_callback

    require_lightning_callback()
    from leafwatch.demo import Classifier

    model = Classifier()
    assert not frames.own(model) and frames.readable(model)


def test_no_path_to_a_module_goes_through_a_monitor_the_user_holds() -> None:
    import torch

    import leafwatch
    from leafwatch.observe.discovery import paths_to, user_scope

    model, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    monitor = leafwatch.Monitor(model, roots={"model": model, "head": head}, verbose=False)
    assert monitor.structure.roots["head"] is head  # it holds the module...
    assert paths_to([head], {"monitor": monitor}) == {}  # ...and is never a path to it
    holder = type("Holder", (), {})()
    holder.head = head
    assert paths_to([head], {"monitor": monitor, "holder": holder}) == {id(head): "holder.head"}
    assert "monitor" not in user_scope()  # the user's variables, leafwatch's own left out
    monitor.close()


def test_a_class_of_an_installed_package_is_a_librarys_and_the_users_is_not() -> None:
    import torch

    assert frames.library_class(torch.nn.Linear) == "torch"
    assert frames.library_class(_UsersMonitor) is None
    assert frames.library_class(frames.PACKAGE_DIR.__class__) is None  # str: the standard library's own
