"""Thinking: the markers of each model family (`format`) and the length rules of a reasoning request (`policy`)."""
