#!/usr/bin/env python3
"""The demo model's corpus: synthetic GSM8K-style arithmetic word problems (seeded, known answers)
and public-domain prose (the raw texts scripts/install-corpus extracts from Debian packages).

Run after scripts/install-corpus (which calls it): writes the training prose to corpus/prose_train.jsonl
(ignored by git) and the held-out evaluation sets to models/demo-moe/eval/ (committed). The problem
generator is also imported by tools/train_demo_moe.py, which makes its training problems on the fly.

Document format (what the model is trained on, one document between <s> and </s>):
    Question: Tom has 12 apples. He buys 7 more and then gives 5 to Anna. How many apples does Tom
    have now?
    Answer: 12 + 7 = 19. 19 - 5 = 14. The answer is 14.
The prompt for evaluation is everything up to and including "Answer:"; the model writes the worked
steps and the final sentence, then </s>. The prediction is the LAST integer in the generated text
(extract_final_number); it is correct when it equals the problem's answer.
Held-out problems never occur in training: training rejects any problem whose (template, numbers)
key or question text belongs to the held-out set.
"""
import argparse
import json
import pathlib
import random
import re

EVAL_SEED = 20240801  # held-out problems
TRAIN_SEED = 1234  # training problems (a different stream; held-out keys are rejected anyway)

NAMES = [("Tom", "he"), ("Anna", "she"), ("Maria", "she"), ("Ben", "he"), ("Lucy", "she"),
         ("Omar", "he"), ("Priya", "she"), ("Sam", "he"), ("Kate", "she"), ("Leo", "he"),
         ("Mia", "she"), ("Noah", "he"), ("Emma", "she"), ("Jack", "he"), ("Sara", "she"),
         ("Ravi", "he"), ("Chen", "he"), ("Nora", "she"), ("Finn", "he"), ("Grace", "she"),
         ("Hugo", "he"), ("Ivy", "she"), ("Paul", "he"), ("Rosa", "she"), ("Tara", "she"),
         ("Yuki", "she"), ("Zoe", "she"), ("Max", "he"), ("Olga", "she"), ("Ali", "he")]
ITEMS = ["apples", "pencils", "marbles", "stickers", "cookies", "books", "shells", "stamps",
         "cards", "eggs", "flowers", "coins", "beads", "balloons", "candies", "oranges", "buttons",
         "crayons", "rocks", "muffins", "toy cars", "ribbons", "plums", "pears", "cupcakes"]
THINGS = [("book", "books"), ("pen", "pens"), ("toy", "toys"), ("hat", "hats"), ("cup", "cups"),
          ("ball", "balls"), ("kite", "kites"), ("lamp", "lamps"), ("shirt", "shirts"),
          ("game", "games"), ("bowl", "bowls"), ("plant", "plants")]
PLANTS = ["roses", "tomatoes", "carrots", "tulips", "beans", "onions", "lettuces", "daisies"]
CONTAINERS = [("box", "boxes"), ("bag", "bags"), ("basket", "baskets"), ("jar", "jars"),
              ("pack", "packs"), ("crate", "crates")]
TIMES = [("in the morning", "in the afternoon"), ("on Monday", "on Tuesday"),
         ("on Saturday", "on Sunday"), ("before lunch", "after lunch")]
MULTIPLES = [(2, "twice"), (3, "three times"), (4, "four times"), (5, "five times")]
CHANGE_NOTES = [20, 50, 100, 200, 500, 1000]


def cap(text):
    return text[0].upper() + text[1:]


def _two_people(rng):
    (n, p), (m, _) = rng.sample(NAMES, 2)
    return n, p, m


def _eq(a, op, b):
    result = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    assert result >= 0 and (op != "/" or a % b == 0)
    return f"{a} {op} {b} = {result}", result


# Each template returns (question, [equation, ...], answer, numbers). The numbers (in the order the
# question states them) with the template's name form the problem's key.

def t_buy_give(rng):
    n, p, m = _two_people(rng)
    item = rng.choice(ITEMS)
    a, b = rng.randint(5, 80), rng.randint(2, 50)
    c = rng.randint(1, a + b - 1)
    q = (f"{n} has {a} {item}. {cap(p)} buys {b} more and then gives {c} to {m}. "
         f"How many {item} does {n} have now?")
    e1, s = _eq(a, "+", b)
    e2, r = _eq(s, "-", c)
    return q, [e1, e2], r, (a, b, c)


def t_boxes_give(rng):
    n, p, _ = _two_people(rng)
    item = rng.choice(ITEMS)
    box, boxes = rng.choice(CONTAINERS)
    a, b = rng.randint(2, 9), rng.randint(2, 25)
    c = rng.randint(1, a * b - 1)
    q = (f"{n} buys {a} {boxes} of {item}. Each {box} has {b} {item}. {cap(p)} gives away {c} "
         f"{item}. How many {item} does {n} have left?")
    e1, x = _eq(a, "*", b)
    e2, r = _eq(x, "-", c)
    return q, [e1, e2], r, (a, b, c)


def t_packs_home(rng):
    n, _, _ = _two_people(rng)
    item = rng.choice(ITEMS)
    box, boxes = rng.choice(CONTAINERS)
    b, a, c = rng.randint(2, 25), rng.randint(2, 9), rng.randint(1, 60)
    q = (f"A shop sells {item} in {boxes} of {b}. {n} buys {a} {boxes} and already has {c} {item} "
         f"at home. How many {item} does {n} have in total?")
    e1, x = _eq(a, "*", b)
    e2, r = _eq(x, "+", c)
    return q, [e1, e2], r, (b, a, c)


def t_share_find(rng):
    n, _, _ = _two_people(rng)
    item = rng.choice(ITEMS)
    b, each, c = rng.randint(2, 9), rng.randint(2, 15), rng.randint(1, 30)
    a = b * each
    q = (f"{n} has {a} {item} and shares them equally among {b} friends. Then each friend finds {c} "
         f"more. How many {item} does each friend have now?")
    e1, x = _eq(a, "/", b)
    e2, r = _eq(x, "+", c)
    return q, [e1, e2], r, (a, b, c)


def t_earn_spend(rng):
    n, p, _ = _two_people(rng)
    thing, _ = rng.choice(THINGS)
    a, b = rng.randint(2, 40), rng.randint(2, 9)
    c = rng.randint(1, a * b - 1)
    q = (f"{n} earns {a} dollars each day for {b} days. Then {p} spends {c} dollars on a {thing}. "
         f"How many dollars does {n} have left?")
    e1, x = _eq(a, "*", b)
    e2, r = _eq(x, "-", c)
    return q, [e1, e2], r, (a, b, c)


def t_pick_bags(rng):
    n, _, _ = _two_people(rng)
    item = rng.choice(ITEMS)
    box, boxes = rng.choice(CONTAINERS)
    first, second = rng.choice(TIMES)
    c, bags = rng.randint(2, 9), rng.randint(2, 15)
    total = c * bags
    a = rng.randint(1, total - 1)
    b = total - a
    q = (f"{n} picks {a} {item} {first} and {b} {item} {second}. {n} puts them into {boxes} of {c}. "
         f"How many {boxes} does {n} fill?")
    e1, s = _eq(a, "+", b)
    e2, r = _eq(s, "/", c)
    return q, [e1, e2], r, (a, b, c)


def t_packs_give(rng):
    n, p, m = _two_people(rng)
    item = rng.choice(ITEMS)
    box, boxes = rng.choice(CONTAINERS)
    a, b, c = rng.randint(1, 50), rng.randint(2, 9), rng.randint(2, 20)
    d = rng.randint(1, a + b * c - 1)
    q = (f"{n} has {a} {item}. {cap(p)} buys {b} {boxes} with {c} {item} in each {box}, then gives "
         f"{d} {item} to {m}. How many {item} does {n} have now?")
    e1, x = _eq(b, "*", c)
    e2, y = _eq(a, "+", x)
    e3, r = _eq(y, "-", d)
    return q, [e1, e2, e3], r, (a, b, c, d)


def t_more_than(rng):
    n, _, m = _two_people(rng)
    item = rng.choice(ITEMS)
    a, b = rng.randint(3, 90), rng.randint(2, 50)
    q = (f"{n} has {a} {item}. {m} has {b} more {item} than {n}. "
         f"How many {item} do {n} and {m} have together?")
    e1, x = _eq(a, "+", b)
    e2, r = _eq(a, "+", x)
    return q, [e1, e2], r, (a, b)


def t_times_as_many(rng):
    n, _, _ = _two_people(rng)
    first, second = rng.choice(TIMES)
    k, word = rng.choice(MULTIPLES)
    a = rng.randint(2, 40)
    q = (f"{n} reads {a} pages {first} and {word} as many pages {second}. "
         f"How many pages does {n} read in all?")
    e1, x = _eq(a, "*", k)
    e2, r = _eq(a, "+", x)
    return q, [e1, e2], r, (a, k)


def t_half_more(rng):
    n, p, m = _two_people(rng)
    item = rng.choice(ITEMS)
    a, b = 2 * rng.randint(2, 60), rng.randint(1, 50)
    q = (f"{n} had {a} {item} and gave half of them to {m}. Then {p} bought {b} more. "
         f"How many {item} does {n} have now?")
    e1, x = _eq(a, "/", 2)
    e2, r = _eq(x, "+", b)
    return q, [e1, e2], r, (a, b)


def t_change(rng):
    n, p, _ = _two_people(rng)
    (thing, things), (thing2, _) = rng.sample(THINGS, 2)
    a, b, c = rng.randint(2, 9), rng.randint(2, 30), rng.randint(1, 60)
    cost = a * b + c
    d = rng.choice([note for note in CHANGE_NOTES if note > cost])
    q = (f"{n} buys {a} {things} for {b} dollars each and a {thing2} for {c} dollars. {cap(p)} pays "
         f"with {d} dollars. How many dollars of change does {n} get?")
    e1, x = _eq(a, "*", b)
    e2, y = _eq(x, "+", c)
    e3, r = _eq(d, "-", y)
    return q, [e1, e2, e3], r, (a, b, c, d)


def t_train(rng):
    a, b, c = rng.randint(10, 90), rng.randint(2, 9), rng.randint(1, 99)
    q = (f"A train travels {a} miles each hour for {b} hours and then {c} more miles. "
         f"How many miles does the train travel in all?")
    e1, x = _eq(a, "*", b)
    e2, r = _eq(x, "+", c)
    return q, [e1, e2], r, (a, b, c)


def t_garden_rows(rng):
    n, p, _ = _two_people(rng)
    plant = rng.choice(PLANTS)
    a, b, c = rng.randint(2, 20), rng.randint(2, 9), rng.randint(1, 15)
    q = (f"A garden has {a} rows of {plant} with {b} plants in each row. {n} plants {c} more rows "
         f"of {b}. How many plants are in the garden now?")
    e1, x = _eq(a, "+", c)
    e2, r = _eq(x, "*", b)
    return q, [e1, e2], r, (a, b, c)


def t_class_leave(rng):
    n, _, _ = _two_people(rng)
    a, b, c = rng.randint(2, 9), rng.randint(10, 35), rng.randint(1, 40)
    c = min(c, a * b - 1)
    d = rng.randint(1, 30)
    q = (f"A school has {a} classes with {b} students in each class. {c} students go home early and "
         f"{d} new students arrive. How many students are at the school now?")
    e1, x = _eq(a, "*", b)
    e2, y = _eq(x, "-", c)
    e3, r = _eq(y, "+", d)
    return q, [e1, e2, e3], r, (a, b, c, d)


TEMPLATES = {f.__name__[2:]: f for f in [
    t_buy_give, t_boxes_give, t_packs_home, t_share_find, t_earn_spend, t_pick_bags, t_packs_give,
    t_more_than, t_times_as_many, t_half_more, t_change, t_train, t_garden_rows, t_class_leave]}
TEMPLATE_NAMES = sorted(TEMPLATES)


def make_problem(rng):
    """One random problem: dict(question, solution, answer, template, numbers)."""
    name = rng.choice(TEMPLATE_NAMES)
    question, equations, answer, numbers = TEMPLATES[name](rng)
    solution = " ".join(e + "." for e in equations) + f" The answer is {answer}."
    return {"question": question, "solution": solution, "answer": answer, "template": name,
            "numbers": list(numbers)}


def problem_key(problem):
    return (problem["template"], tuple(problem["numbers"]))


def prompt_text(question):
    """What the model is given at evaluation (a BOS token goes before it)."""
    return f"Question: {question}\nAnswer:"


def document_text(problem):
    """One training document (between <s> and </s>)."""
    return f"{prompt_text(problem['question'])} {problem['solution']}"


_INTEGER = re.compile(r"-?\d+")


def extract_final_number(generated):
    """The prediction: the last integer in the generated answer text, or None."""
    found = _INTEGER.findall(generated)
    return int(found[-1]) if found else None


def generate_problems(seed, count, exclude=None):
    """count distinct problems from a seeded stream, skipping keys and questions in `exclude`
    (a dict with sets "keys" and "questions")."""
    rng = random.Random(seed)
    seen_keys, out = set(), []
    excluded_keys = exclude["keys"] if exclude else set()
    excluded_questions = exclude["questions"] if exclude else set()
    while len(out) < count:
        problem = make_problem(rng)
        key = problem_key(problem)
        if key in seen_keys or key in excluded_keys or problem["question"] in excluded_questions:
            continue
        seen_keys.add(key)
        out.append(problem)
    return out


def training_documents(seed, count, exclude):
    """count training documents (texts, repeats of a key allowed, held-out keys never)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        problem = make_problem(rng)
        if problem_key(problem) in exclude["keys"] or problem["question"] in exclude["questions"]:
            continue
        out.append(document_text(problem))
    return out


def load_heldout_problems(path):
    problems = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line]
    return problems, {"keys": {problem_key(p) for p in problems},
                      "questions": {p["question"] for p in problems}}


# ---- prose -----------------------------------------------------------------------------------

def _austen_paragraphs(text):
    """Paragraphs of a Project Gutenberg style text (lines wrapped, blank line between paragraphs)."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        line = " ".join(part.strip() for part in block.splitlines() if part.strip())
        line = line.replace("_", "")
        if line:
            paragraphs.append(line)
    return paragraphs


def _kjv_paragraphs(text, verses_per_paragraph=4):
    """`bible -l...` output: a "Book N" header line, then one "  N text" line a verse."""
    paragraphs, verses = [], []
    for line in text.splitlines():
        match = re.match(r"^\s+\d+\s+(.*)$", line)
        if match:
            verses.append(match.group(1).strip())
            if len(verses) == verses_per_paragraph:
                paragraphs.append(" ".join(verses))
                verses = []
        elif line.strip():  # a chapter header: close the paragraph
            if verses:
                paragraphs.append(" ".join(verses))
            verses = []
    if verses:
        paragraphs.append(" ".join(verses))
    return paragraphs


def read_sources(raw_dir):
    """{source name: [paragraph, ...]} from corpus/raw (see scripts/install-corpus)."""
    raw_dir = pathlib.Path(raw_dir)
    sources = {}
    for path in sorted(raw_dir.glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        sources[path.stem] = _kjv_paragraphs(text) if path.stem == "kjv" else _austen_paragraphs(text)
    if not sources:
        raise SystemExit(f"make_demo_corpus: no texts in {raw_dir}: run scripts/install-corpus")
    return sources


BLOCK_PARAGRAPHS = 12  # held-out prose: every HELDOUT_EVERY-th block of this many paragraphs
HELDOUT_EVERY = 40


def split_prose(sources):
    """(training paragraphs, held-out blocks) with each block a list of consecutive paragraphs."""
    train, heldout = [], []
    for name in sorted(sources):
        paragraphs = sources[name]
        for b, start in enumerate(range(0, len(paragraphs), BLOCK_PARAGRAPHS)):
            block = paragraphs[start:start + BLOCK_PARAGRAPHS]
            (heldout.append(block) if b % HELDOUT_EVERY == HELDOUT_EVERY - 1 else train.append(block))
    return [p for block in train for p in block], heldout


def passages(blocks, max_chars, limit):
    """Held-out passages: consecutive paragraphs joined by blank lines, at most max_chars each."""
    out = []
    for block in blocks:
        current = ""
        for paragraph in block:
            if len(paragraph) > max_chars:
                cut = paragraph.rfind(". ", 0, max_chars)
                paragraph = paragraph[:cut + 1] if cut > 0 else paragraph[:max_chars]
            joined = f"{current}\n\n{paragraph}" if current else paragraph
            if len(joined) > max_chars:
                out.append(current)
                joined = paragraph
            current = joined
        if current:
            out.append(current)
    out = [p for p in out if len(p) >= 200]  # drop chapter titles and other scraps
    step = max(1, len(out) // limit)
    return out[::step][:limit]


def training_prose_documents(paragraphs, max_chars=2000):
    """Training prose as documents of consecutive paragraphs, about max_chars each."""
    docs, current = [], ""
    for paragraph in paragraphs:
        current = f"{current}\n\n{paragraph}" if current else paragraph
        if len(current) >= max_chars:
            docs.append(current)
            current = ""
    if current:
        docs.append(current)
    return docs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="corpus", help="corpus folder (raw/ inside, from install-corpus)")
    parser.add_argument("--eval-dir", default="models/demo-moe/eval")
    parser.add_argument("--eval-problems", type=int, default=1000)
    parser.add_argument("--eval-passages", type=int, default=300)
    args = parser.parse_args()
    corpus, eval_dir = pathlib.Path(args.corpus), pathlib.Path(args.eval_dir)
    eval_dir.mkdir(parents=True, exist_ok=True)

    sources = read_sources(corpus / "raw")
    train, heldout_blocks = split_prose(sources)
    docs = training_prose_documents(train)
    with open(corpus / "prose_train.jsonl", "w", encoding="utf-8") as f:
        for text in docs:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    heldout = passages(heldout_blocks, max_chars=1000, limit=args.eval_passages)
    with open(eval_dir / "prose.jsonl", "w", encoding="utf-8") as f:
        for text in heldout:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")

    problems = generate_problems(EVAL_SEED, args.eval_problems)
    with open(eval_dir / "arithmetic.jsonl", "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p) + "\n")
    chars = sum(len(d) for d in docs)
    print(f"make_demo_corpus: {len(sources)} prose sources, {len(docs)} training documents "
          f"({chars / 1e6:.1f} M chars) -> {corpus / 'prose_train.jsonl'}; {len(heldout)} held-out passages, "
          f"{len(problems)} held-out problems -> {eval_dir}")


if __name__ == "__main__":
    main()
