from .cli import run

if __name__ == "__main__":  # not when a spawned process imports this module as __mp_main__
    run()
