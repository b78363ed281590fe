"""The task families of the extract environment: facts, a short document stating them, the fields to extract.

A family samples *facts* (plain JSON data: the values to extract plus whatever else the document
says, such as a distractor amount) and renders them as (document, fields, truth). The environment
hashes the facts, not the wording, for the split and for duplicates, and renders with an rng seeded
by that hash: the same facts always read the same, and never reach both splits.

A field is ``(name, type, options)``: type one of string, number, integer, date, enum; options
``minimum``, ``maximum``, ``values`` (enum) and ``nullable`` (the value is null when the document
does not give it; the prompt says "or null").
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass
from typing import Any, Callable

Field = tuple[str, str, dict]
Rendered = tuple[str, list[Field], dict[str, Any]]  # (document, fields, truth)

VENDORS = ("Nordwind GmbH", "Acme Corp", "Blue Harbor Ltd", "Kestrel Systems", "Pinecrest Supply", "Orbit Labs",
           "Redline Tools", "Silverleaf Foods", "Granite Works", "Maple Print Co", "Cobalt Logistics", "Juniper Media")
UNICODE_VENDORS = ("Müller & Söhne AG", "Café Lumière SARL", "Øresund Design ApS", "Ñandú Textiles SA",
                   "Škoda Díly s.r.o.", "Łódź Metal Sp. z o.o.", "Bäckerei Köhler GmbH", "Ångström Optik AB",
                   "Ηλιος Ltd", "Société Crème", "Çelik Yapı AŞ", "Straße & Weg KG")
PEOPLE = ("Anna Berg", "Tom Reed", "Maria Lopez", "Sam Patel", "Lena Fischer", "Omar Haddad", "Grace Kim",
          "Paul Novak", "Ines Costa", "Raj Mehta", "Eva Lind", "Noah Brooks")
UNICODE_PEOPLE = ("Zoë Brontë", "José Núñez", "Åsa Øberg", "Chloé Dubé", "Jürgen Weiß", "Łukasz Żak",
                  "Björn Ångström", "Σοφία Παππά", "Иван Петров", "李雷", "Ayşe Yılmaz", "Françoise Lévêque")
SUBJECTS = ("Q3 planning", "Budget review", "Design sync", "Hiring plan", "Release checklist", "Vendor contract",
            "Team offsite", "Security audit", "Roadmap update", "Customer visit")
UNICODE_SUBJECTS = ("Réunion budget", "Übergabe Projekt", "Café order", "Año nuevo plan", "Ærø trip",
                    "Überprüfung Q2", "Déjà vu bug", "Smörgåsbord lunch")
SERVICES = ("auth", "billing", "search", "gateway", "payments", "storage", "mailer", "scheduler")
MESSAGES = ("request failed", "upstream timeout", "cache miss", "job finished", "slow query", "token refreshed")
LEVELS = ("DEBUG", "INFO", "WARN", "ERROR")
CURRENCIES = ("EUR", "USD", "GBP")
SYMBOLS = {"EUR": "€", "USD": "$", "GBP": "£"}
CURRENCY_WORDS = {"EUR": ("eur", "Eur", "euros", "Euro"), "USD": ("usd", "Usd", "US dollars", "dollars"),
                  "GBP": ("gbp", "Gbp", "pounds sterling", "British pounds")}
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")

# Fields shared by several families.
VENDOR: Field = ("vendor", "string", {})
TOTAL: Field = ("total", "number", {"minimum": 0})
CURRENCY: Field = ("currency", "enum", {"values": list(CURRENCIES)})
DUE: Field = ("due", "date", {})
SENDER: Field = ("sender", "string", {})
SUBJECT: Field = ("subject", "string", {})
MEETING: Field = ("meeting", "date", {})
ROOM: Field = ("room", "integer", {"minimum": 1, "maximum": 30})
LOG_FIELDS: list[Field] = [("date", "date", {}), ("level", "enum", {"values": list(LEVELS)}), ("service", "string", {}),
                           ("code", "integer", {"minimum": 100, "maximum": 599}),
                           ("retries", "integer", {"minimum": 0, "maximum": 10})]


# -- values and how documents write them -------------------------------------------------------

def _date(rng: random.Random) -> str:
    return (datetime.date(2023, 1, 1) + datetime.timedelta(days=rng.randint(0, 4 * 365))).isoformat()


def _date_in_words(iso: str, rng: random.Random) -> str:
    day = datetime.date.fromisoformat(iso)
    month = MONTHS[day.month - 1]
    return rng.choice([f"{day.day} {month} {day.year}", f"{month} {day.day}, {day.year}",
                       f"{day.day} {month[:3]} {day.year}", f"{day.day:02d}.{day.month:02d}.{day.year}"])


def _amount(cents: int) -> int | float:
    """The JSON value of an amount: whole amounts as integers, others with their cents."""
    return cents // 100 if cents % 100 == 0 else cents / 100


def _plain(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


def _grouped(cents: int, currency: str) -> str:
    """With thousands separators: 12,450.75 (USD, GBP) or 12.450,75 (EUR, continental style)."""
    text = f"{cents // 100:,}.{cents % 100:02d}"
    return text.replace(",", " ").replace(".", ",").replace(" ", ".") if currency == "EUR" else text


def _first(name: str) -> str:
    return name.split()[0]


def _pick_two(pool: tuple[str, ...], rng: random.Random) -> list[str]:
    return rng.sample(pool, 2)


# -- documents ---------------------------------------------------------------------------------

def _invoice_doc(vendor: str, number: int, amount: str, currency: str, due: str, rng: random.Random) -> str:
    return rng.choice([
        f"Invoice {number} from {vendor}. Total: {amount} {currency}. Due date: {due}.",
        f"{vendor}\nInvoice no. {number}\nAmount due: {amount} {currency}\nPay by: {due}",
        f"Hello, please find invoice {number} attached. {vendor} bills {amount} {currency}, payable by {due}.",
    ])


def _email_doc(sender: str, to: str, subject: str, when: str, room: int, rng: random.Random) -> str:
    body = rng.choice([f"can we meet on {when} in room {room}?", f"let's meet {when}, room {room}.",
                       f"the meeting is on {when} in room {room}."])
    return f"From: {sender}\nTo: {to}\nSubject: {subject}\n\nHi {_first(to)}, {body} {_first(sender)}"


def _log_doc(facts: dict, level: str, rng: random.Random) -> str:
    f = facts
    return rng.choice([
        f"{f['date']} {f['time']} {level} [{f['service']}] {f['message']} (code {f['code']}, retries {f['retries']})",
        f"ts={f['date']}T{f['time']} level={level} svc={f['service']} code={f['code']} retries={f['retries']} "
        f"msg=\"{f['message']}\"",
    ])


# -- families ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Family:
    name: str
    slice: str
    sample: Callable[[random.Random], dict]  # rng -> facts
    render: Callable[[dict, random.Random], Rendered]


def _invoice_facts(rng: random.Random, vendors: tuple[str, ...] = VENDORS) -> dict:
    return {"vendor": rng.choice(vendors), "number": rng.randint(1000, 9999), "cents": rng.randint(100, 99999),
            "currency": rng.choice(CURRENCIES), "due": _date(rng)}


def _invoice_render(f: dict, rng: random.Random) -> Rendered:
    doc = _invoice_doc(f["vendor"], f["number"], _plain(f["cents"]), f["currency"], f["due"], rng)
    return doc, [VENDOR, TOTAL, CURRENCY, DUE], \
        {"vendor": f["vendor"], "total": _amount(f["cents"]), "currency": f["currency"], "due": f["due"]}


def _email_facts(rng: random.Random, people: tuple[str, ...] = PEOPLE, subjects: tuple[str, ...] = SUBJECTS) -> dict:
    sender, to = _pick_two(people, rng)
    subject = rng.choice(subjects)
    return {"sender": sender, "to": to, "subject": ("Re: " if rng.random() < 0.3 else "") + subject,
            "meeting": _date(rng), "room": rng.randint(1, 30)}


def _email_render(f: dict, rng: random.Random, when: str | None = None) -> Rendered:
    doc = _email_doc(f["sender"], f["to"], f["subject"], when or f["meeting"], f["room"], rng)
    return doc, [SENDER, SUBJECT, MEETING, ROOM], \
        {"sender": f["sender"], "subject": f["subject"], "meeting": f["meeting"], "room": f["room"]}


def _log_facts(rng: random.Random, retries: int | None = None) -> dict:
    return {"date": _date(rng), "time": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
            "level": rng.choice(LEVELS), "service": rng.choice(SERVICES), "message": rng.choice(MESSAGES),
            "code": rng.choice((200, 201, 301, 400, 401, 403, 404, 409, 429, 500, 502, 503, 504)),
            "retries": rng.randint(0, 10) if retries is None else retries}


def _log_render(f: dict, rng: random.Random, level_text: str | None = None) -> Rendered:
    doc = _log_doc(f, level_text or f["level"], rng)
    return doc, LOG_FIELDS, {k: f[k] for k in ("date", "level", "service", "code", "retries")}


def _contract_facts(rng: random.Random) -> dict:
    client, supplier = _pick_two(VENDORS, rng)
    return {"client": client, "supplier": supplier, "start": _date(rng), "months": rng.choice((3, 6, 12, 18, 24, 36, 48)),
            "cents": rng.randint(50, 5000) * 1000 + rng.choice((0, 0, 50, 99)), "currency": rng.choice(CURRENCIES)}


def _contract_render(f: dict, rng: random.Random, start: str | None = None) -> Rendered:
    when = start or f["start"]
    doc = rng.choice([
        f"Service agreement between {f['client']} (client) and {f['supplier']} (supplier), starting {when} "
        f"for {f['months']} months. Fee: {_plain(f['cents'])} {f['currency']} per month.",
        f"{f['supplier']} will provide services to {f['client']} for {f['months']} months from {when}. "
        f"The client pays {_plain(f['cents'])} {f['currency']} monthly.",
    ])
    fields = [("client", "string", {}), ("supplier", "string", {}), ("start", "date", {}),
              ("months", "integer", {"minimum": 1, "maximum": 60}), ("fee", "number", {"minimum": 0}), CURRENCY]
    truth = {"client": f["client"], "supplier": f["supplier"], "start": f["start"], "months": f["months"],
             "fee": _amount(f["cents"]), "currency": f["currency"]}
    return doc, fields, truth


# edge ----------------------------------------------------------------------------------------

def _optional_facts(rng: random.Random) -> dict:
    facts = _invoice_facts(rng)
    present = rng.choice([(True, False), (False, True), (False, False)])  # at least one of po, due is missing
    facts["po"] = f"PO-{rng.randint(10000, 99999)}" if present[0] else None
    facts["due"] = facts["due"] if present[1] else None
    return facts


def _optional_render(f: dict, rng: random.Random) -> Rendered:
    doc = f"Invoice from {f['vendor']}: {_plain(f['cents'])} {f['currency']}."
    doc += f" Purchase order {f['po']}." if f["po"] else ""
    doc += f" Due {f['due']}." if f["due"] else ""
    fields = [VENDOR, TOTAL, CURRENCY, ("po", "string", {"nullable": True}), ("due", "date", {"nullable": True})]
    return doc, fields, {"vendor": f["vendor"], "total": _amount(f["cents"]), "currency": f["currency"],
                         "po": f["po"], "due": f["due"]}


def _unicode_facts(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return {"form": "email", **_email_facts(rng, UNICODE_PEOPLE, UNICODE_SUBJECTS)}
    return {"form": "invoice", **_invoice_facts(rng, UNICODE_VENDORS)}


def _unicode_render(f: dict, rng: random.Random) -> Rendered:
    return _email_render(f, rng) if f["form"] == "email" else _invoice_render(f, rng)


def _thousands_facts(rng: random.Random) -> dict:
    return {**_invoice_facts(rng), "cents": rng.randint(100_000, 99_999_999)}


def _thousands_render(f: dict, rng: random.Random) -> Rendered:
    doc = _invoice_doc(f["vendor"], f["number"], _grouped(f["cents"], f["currency"]), f["currency"], f["due"], rng)
    return doc, [VENDOR, TOTAL, CURRENCY, DUE], \
        {"vendor": f["vendor"], "total": _amount(f["cents"]), "currency": f["currency"], "due": f["due"]}


def _zero_facts(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return {"form": "log", **_log_facts(rng, retries=0)}
    return {"form": "credit", **_invoice_facts(rng), "cents": 0}


def _zero_render(f: dict, rng: random.Random) -> Rendered:
    if f["form"] == "log":
        return _log_render(f, rng)
    doc = (f"Credit note {f['number']} from {f['vendor']}. The invoice was fully credited. "
           f"Balance due: 0.00 {f['currency']} by {f['due']}.")
    return doc, [VENDOR, TOTAL, CURRENCY, DUE], \
        {"vendor": f["vendor"], "total": 0, "currency": f["currency"], "due": f["due"]}


# failure modes -------------------------------------------------------------------------------

def _distractor_facts(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        facts = _email_facts(rng)
        sent = _date(rng)
        return {"form": "email", **facts, "sent": sent if sent != facts["meeting"] else "2022-12-31"}
    facts = _invoice_facts(rng)
    rate = rng.choice((5, 10, 19, 20))
    subtotal = rng.randint(100, 99999)
    return {"form": "invoice", **facts, "subtotal": subtotal, "rate": rate, "cents": subtotal + subtotal * rate // 100}


def _distractor_render(f: dict, rng: random.Random) -> Rendered:
    if f["form"] == "email":
        doc, fields, truth = _email_render(f, rng)
        return f"Sent: {f['sent']}\n{doc}", fields, truth
    tax = f["cents"] - f["subtotal"]
    lines = [f"Subtotal: {_plain(f['subtotal'])}", f"VAT {f['rate']}%: {_plain(tax)}", f"Total: {_plain(f['cents'])}"]
    if rng.random() < 0.5:
        lines.reverse()  # the total is not always the last amount
    doc = f"Invoice {f['number']} from {f['vendor']} ({f['currency']}). " + ", ".join(lines) + f". Due {f['due']}."
    return doc, [VENDOR, TOTAL, CURRENCY, DUE], \
        {"vendor": f["vendor"], "total": _amount(f["cents"]), "currency": f["currency"], "due": f["due"]}


def _date_words_facts(rng: random.Random) -> dict:
    form = rng.choice(("invoice", "email"))  # not contracts: the heldout family's document kind
    facts = {"invoice": _invoice_facts, "email": _email_facts}[form](rng)
    return {"form": form, **facts}


def _date_words_render(f: dict, rng: random.Random) -> Rendered:
    if f["form"] == "email":
        return _email_render(f, rng, when=_date_in_words(f["meeting"], rng))
    doc = _invoice_doc(f["vendor"], f["number"], _plain(f["cents"]), f["currency"], _date_in_words(f["due"], rng), rng)
    return doc, [VENDOR, TOTAL, CURRENCY, DUE], \
        {"vendor": f["vendor"], "total": _amount(f["cents"]), "currency": f["currency"], "due": f["due"]}


def _enum_case_facts(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return {"form": "log", **_log_facts(rng), "case": rng.choice(("lower", "title"))}
    return {"form": "invoice", **_invoice_facts(rng), "word": rng.randrange(4)}


def _enum_case_render(f: dict, rng: random.Random) -> Rendered:
    if f["form"] == "log":
        level = f["level"].lower() if f["case"] == "lower" else f["level"].title()
        return _log_render(f, rng, level_text=level)
    word = CURRENCY_WORDS[f["currency"]][f["word"]]
    doc = _invoice_doc(f["vendor"], f["number"], _plain(f["cents"]), word, f["due"], rng)
    return doc, [VENDOR, TOTAL, CURRENCY, DUE], \
        {"vendor": f["vendor"], "total": _amount(f["cents"]), "currency": f["currency"], "due": f["due"]}


def _numeric_facts(rng: random.Random) -> dict:
    return {"order": rng.randint(1000, 99999), "qty": rng.randint(1, 99), "price": rng.randint(50, 99999),
            "shipping": rng.choice((0, 499, 599, 999, 1250)), "currency": rng.choice(CURRENCIES)}


def _numeric_render(f: dict, rng: random.Random) -> Rendered:
    symbol = SYMBOLS[f["currency"]]
    price, shipping = _plain(f["price"]), _plain(f["shipping"])
    doc = rng.choice([
        f"Order #{f['order']}: {f['qty']} pcs at {symbol}{price} each, shipping {symbol}{shipping}.",
        f"Order no. {f['order']} - quantity: {f['qty']} items, unit price {symbol}{price}, delivery {symbol}{shipping}.",
    ])
    fields = [("order", "integer", {"minimum": 1}), ("qty", "integer", {"minimum": 1, "maximum": 99}),
              ("price", "number", {"minimum": 0}), ("shipping", "number", {"minimum": 0}), CURRENCY]
    return doc, fields, {"order": f["order"], "qty": f["qty"], "price": _amount(f["price"]),
                         "shipping": _amount(f["shipping"]), "currency": f["currency"]}


FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("invoice", "core", _invoice_facts, _invoice_render),
    Family("email", "core", _email_facts, _email_render),
    Family("log", "core", _log_facts, _log_render),
    Family("contract", "heldout", _contract_facts, _contract_render),  # a document kind train never shows
    Family("optional", "edge", _optional_facts, _optional_render),
    Family("unicode", "edge", _unicode_facts, _unicode_render),
    Family("thousands", "edge", _thousands_facts, _thousands_render),
    Family("zero", "edge", _zero_facts, _zero_render),
    Family("distractor", "failure_modes", _distractor_facts, _distractor_render),
    Family("date_words", "failure_modes", _date_words_facts, _date_words_render),
    Family("enum_case", "failure_modes", _enum_case_facts, _enum_case_render),
    Family("numeric", "failure_modes", _numeric_facts, _numeric_render),
)}
