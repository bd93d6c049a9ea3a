"""A differential test harness for hot-swapping: what runs must equal a fresh start, or be reported.

project.py renders small two-file projects from parameters; generator.py makes
random sequences of saves over them; script.py is the second family (a
script-style train.py run with command-line arguments, and its sequences);
oracle.py runs saved files fresh in a long-lived subprocess; live.py drives a
real Session through the same saves; judge.py compares the two and says which
differences no reload event mentioned.
"""
