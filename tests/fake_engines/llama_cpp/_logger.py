def set_verbose(verbose):
    pass
