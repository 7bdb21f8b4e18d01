"""Prints the machine's load average: state of the machine, not of the program."""
import os

for _ in range(3):
    print("load average %.2f %.2f %.2f" % os.getloadavg())
