"""The fault cases of the reliability rounds (issues 31 and 50), kept holding. README.md beside this file maps each
case to the test that holds it, here or where the code it checks is tested (test_index.py keeps that map true)."""
