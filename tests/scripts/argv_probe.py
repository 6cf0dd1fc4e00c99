"""Prints what `python script.py` would show: argv, __name__, sys.path[0]; exits with argv[1]."""
import os
import pickle
import sys


class Local:
    pass


print("argv", sys.argv)
print("name", __name__)
print("path0", os.path.realpath(sys.path[0]))
print("file", os.path.realpath(__file__))
print("pickled", type(pickle.loads(pickle.dumps(Local()))).__name__)
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    def inner():
        raise ValueError("boom from the script")
    inner()
if len(sys.argv) > 1:
    sys.exit(int(sys.argv[1]))
