from greet import greeting


def check() -> None:
    assert greeting("Ada").startswith("Hello"), greeting("Ada")
    assert greeting("Ada").endswith("Ada!"), greeting("Ada")


if __name__ == "__main__":
    check()
    print("ok")
