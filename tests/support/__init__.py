"""Helpers the tests share (servers, fakes, data, processes); fixtures stay in conftest.py."""
