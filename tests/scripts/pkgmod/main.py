import sys

print("argv", sys.argv[1:])
print("name", __name__)
sys.exit(3)
