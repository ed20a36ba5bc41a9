"""Prints what a script sees of how it was run: argv, __name__, sys.path[0], __file__."""

import json
import os
import sys

from helper_module import HELPER_VALUE  # importable only when sys.path[0] is this folder

print(json.dumps({
    "argv": sys.argv,
    "name": __name__,
    "path0": os.path.abspath(sys.path[0]),
    "file": os.path.abspath(__file__),
    "helper": HELPER_VALUE,
}))
