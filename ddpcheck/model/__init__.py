"""The one analysis pass: parse a file once, build a ScriptModel, let rules query it."""
