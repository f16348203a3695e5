"""(rule module being written; registers nothing yet)"""
