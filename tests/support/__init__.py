"""Helpers the tests import: image generators, stand-ins for cluster APIs, private servers and containers."""
