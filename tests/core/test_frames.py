"""frames.py: the first frame of user code, for warnings, watch locations and caller names."""

from __future__ import annotations

import sys

import pytest

from leafwatch.observe import frames


def test_from_user_code_the_first_user_frame_is_the_caller() -> None:
    here = sys._getframe()
    assert frames.user_frame() is here
    assert next(frames.user_frames()) is here
    assert frames.stacklevel_outside() == 1
    assert frames.caller_location() == f"{__file__}:{here.f_lineno}"


def test_frames_of_a_skipped_folder_are_passed_over() -> None:
    def inner() -> tuple[object, int]:
        return frames.user_frame(skip=(__file__,)), frames.stacklevel_outside(skip=(__file__,))

    frame, level = inner()
    assert frame is not None and frame.f_code.co_filename != __file__
    assert level > 2


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
