"""Tools that work on the repository (not part of the ``mlsys_nb`` package a learner imports): ``build_site``."""
