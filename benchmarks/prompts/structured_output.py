"""structured_output: JSON and YAML answers (expected output 50-200 tokens).

Five task families, each block used at most once per run: extract fields from a short text (English
or Korean) into JSON, invent a JSON object of a given shape, write a YAML configuration, convert a
small table or document between formats, and label short reviews as a JSON array."""
from __future__ import annotations

import random

from benchmarks.prompts.korean import ko_people
from benchmarks.prompts.text import MONTHS, WEEKDAYS, apportion, clamp_round, deck, firm, people, town

LO, HI = 50, 200


def _extract_sources(rng: random.Random) -> list[tuple[str, str, str]]:
    """(kind of text, text, comma-separated keys) for every extraction source, filled with fresh facts."""
    return _english_extracts(rng) + _korean_extracts(rng)


def _english_extracts(rng: random.Random) -> list[tuple[str, str, str]]:
    p = people(rng, 3)
    month, month2 = rng.sample(MONTHS, 2)
    day, h = rng.randint(2, 19), rng.randint(9, 17)
    price = rng.randrange(40, 400, 5)
    return [
        ("club announcement", f"Hi all! The {town(rng)} Photography Club is holding its spring exhibition on {month} "
         f"{day} from {h}:00 to {h + 3}:00 at the old library on Mill Street. Entry is {rng.randint(3, 9)} euros, "
         f"free for members and under-16s. {p[0]} will give a short talk at {h}:30. Please reply by {month} "
         f"{day - 1} so we can plan the refreshments.",
         "event_name, organizer, date, start_time, end_time, venue, entry_fee_eur, free_for, speaker, rsvp_by"),
        ("job posting", f"{firm(rng)} is hiring a Senior Data Analyst for its office in {town(rng)}. You will build "
         f"dashboards, design experiments and present findings to product managers. We are looking for at least "
         f"{rng.randint(3, 6)} years of SQL and Python; experience with dbt is a plus. Hybrid: two days a week in "
         f"the office. Salary {rng.randint(48, 60)}k to {rng.randint(66, 85)}k euros depending on experience. "
         f"Applications close on {month} {day}.",
         "title, company, location, work_mode, min_years_experience, required_skills, nice_to_have, salary_min, "
         "salary_max, currency, deadline"),
        ("customer email", f"Subject: Order {rng.randint(100000, 999999)} arrived damaged\n\nHello, my order "
         f"arrived yesterday, but the ceramic lamp inside was cracked and the box was crushed on one side. I paid "
         f"{price} euros and would like a replacement rather than a refund, as it is a gift. I have attached two "
         f"photos. How do I send the broken one back? Thanks, {p[1]}",
         "customer_name, order_id, product, problem, requested_resolution, amount_paid, sentiment"),
        ("product listing", f"TrailLite {rng.randint(2, 4)} tent by {firm(rng).split()[0]}: sleeps two, weighs "
         f"just 1.6 kg and packs down to the size of a water bottle. Waterproof to 3,000 mm, with two doors and two "
         f"porches. Colours: olive or sand. Now {price} euros (was {price + rng.randrange(30, 120, 10)}).",
         "product_name, brand, capacity, weight_kg, waterproof_mm, colours, price, original_price"),
        ("meeting note", f"Sync, {month} {day}: {p[0]}, {p[1]} and {p[2]} attended. We agreed to move the launch "
         f"to the second week of {month2}. {p[0]} will update the roadmap by Friday; {p[1]} will call the two "
         f"pilot customers; {p[2]} owns the pricing page draft, due next Wednesday.",
         "date, attendees, decisions, action_items (each with owner, task, due)"),
        ("flat listing", f"Bright two-bedroom flat to rent in {town(rng)}, third floor with lift, "
         f"{rng.randint(55, 90)} m². Rent {rng.randrange(700, 1500, 25)} per month plus about 120 for utilities; "
         f"deposit of two months' rent. Available from {month} 1. Pets on request, no smoking. Call {p[2]} on "
         f"weekdays after 5 pm.",
         "bedrooms, floor, has_lift, area_m2, rent, utilities, deposit_months, available_from, pets, smoking, "
         "contact"),
        ("reminder message", f"Reminder: {p[1]}, your dental check-up with Dr {p[0].split()[-1]} is on "
         f"{rng.choice(WEEKDAYS)} {day} {month} at {h}:15. Please arrive ten minutes early and bring your "
         f"insurance card. Reply C to confirm or R to reschedule.",
         "patient, appointment_type, dentist, date, time, arrive_minutes_early, bring, reply_options"),
        ("booking confirmation", f"Your booking is confirmed. Reference {rng.choice('KLMPQRTV')}"
         f"{rng.randint(1000, 9999)}X. Passenger: {p[2]}. Outbound: {town(rng)} to {town(rng)}, {day} {month}, "
         f"departs 07:45, arrives 10:20. Return: {day + rng.randint(3, 9)} {month}, departs 18:05, arrives 20:40. "
         f"One cabin bag included; checked baggage not included. Total paid: {price * 2} euros.",
         "reference, passenger, outbound (from, to, date, departs, arrives), return (date, departs, arrives), "
         "baggage, total_paid"),
        ("recipe note", f"This lemon and herb roast chicken serves {rng.randint(3, 6)} and takes about 90 minutes. "
         "You need one whole chicken, two lemons, a bunch of thyme, six cloves of garlic, olive oil and salt. Roast "
         f"at {rng.choice((190, 200, 210))}°C for 75 minutes, then rest for 15 minutes before carving.",
         "dish, servings, total_minutes, ingredients, oven_c, roast_minutes, rest_minutes"),
        ("bug report", f"Since updating to version {rng.randint(3, 9)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}, "
         "the app closes whenever I export a report as PDF. It happens on Windows 11 but not on my Mac. Steps: open "
         "any project, click Export, choose PDF, press Save, and the window disappears. No error message. This "
         "blocks our monthly reporting, so it is fairly urgent.",
         "app_version, feature, affected_platforms, unaffected_platforms, steps, error_message, severity"),
        ("invoice", f"Invoice {rng.randint(2024, 2027)}-{rng.randint(100, 999)} from {firm(rng)} to {firm(rng)}, "
         f"dated {day} {month}. Items: 3 consulting days at 850.00 each; travel expenses 212.40. VAT at 20 percent. "
         "Payment due within 30 days.",
         "invoice_number, seller, buyer, date, line_items (description, quantity, unit_price), vat_rate, "
         "payment_terms_days"),
    ]


def _korean_extracts(rng: random.Random) -> list[tuple[str, str, str]]:
    k = ko_people(rng, 3)
    day = rng.randint(2, 28)
    return [
        ("예약 문자", f"[{rng.choice(('한솥밥상', '바다정원', '고운식탁'))}] {k[0]}님, {rng.randint(1, 12)}월 {day}일 "
         f"저녁 {rng.randint(6, 8)}시 30분 {rng.randint(2, 8)}명 예약이 확정되었습니다. 요청하신 창가 자리로 준비해 "
         "두겠습니다. 예약 변경은 방문 하루 전까지 가능합니다.",
         "name, date, time, party_size, seat, change_deadline"),
        ("배송 문의", f"안녕하세요. 지난 {rng.choice('월화수목')}요일에 주문한 블루투스 스피커(주문번호 "
         f"{rng.randint(20000000, 29999999)})가 아직 도착하지 않았습니다. 배송 조회를 해 보면 사흘째 '배송 중'으로만 "
         "나옵니다. 이번 주 토요일에 선물할 물건이라 그 전에 받을 수 있는지 알려 주세요. 연락처는 "
         f"010-{rng.randint(2000, 9999)}-{rng.randint(1000, 9999)}입니다. {k[1]} 드림",
         "customer_name, order_id, product, issue, needed_by, phone"),
        ("중고 판매 글", f"아이 방을 정리하면서 원목 책상과 의자 세트를 판매합니다. {rng.randint(2, 5)}년 동안 썼고, 책상 "
         f"크기는 가로 120센티미터, 세로 60센티미터입니다. 가격은 {rng.randrange(8, 25)}만 원이며 직접 가지러 "
         "오셔야 합니다. 평일 저녁에 연락 주세요.",
         "item, years_used, width_cm, depth_cm, price_krw, pickup_only, contact_time"),
        ("회의 메모", f"{rng.randint(1, 12)}월 {day}일 주간 회의. 참석: {k[0]}, {k[1]}, {k[2]}. 결정 사항: 하반기 사내 "
         f"교육은 온라인으로 진행한다. 할 일: {k[0]} - 교육 업체 견적 비교(다음 주 수요일까지), {k[1]} - 설문지 작성, "
         f"{k[2]} - 예산안 정리.",
         "date, attendees, decisions, action_items (each with owner, task, due)"),
        ("행사 안내", f"청년센터에서 '나만의 가계부 만들기' 강좌를 엽니다. 일시는 {rng.randint(1, 12)}월 {day}일 저녁 "
         f"7시, 장소는 센터 3층 강의실이며 참가비는 무료입니다. 만 19세에서 34세 청년 {rng.randint(15, 40)}명을 "
         "선착순으로 모집합니다.",
         "title, organizer, datetime, location, fee, eligibility, capacity"),
    ]


_EXTRACT_FRAMES = ("Extract these fields from the {kind} below and return them as a JSON object: {keys}. Use null "
                   "for anything not mentioned.",
                   "Read the {kind} below and output only valid JSON with the keys {keys}.",
                   "Return a JSON object with the keys {keys}, filled in from this {kind}. No commentary.")
_KO_EXTRACT_FRAMES = ("다음 글에서 정보를 뽑아 JSON으로 돌려주세요. 값은 원문 그대로 적고, 키는 다음과 같이 해 주세요: {keys}",
                      "Extract {keys} from this Korean text and return JSON. Keep the values in Korean.")
_INVENT = (
    ("a fictional book", "title, author, year, genres (array), pages, one_sentence_summary", 120),
    ("a vegetarian soup recipe", "name, servings, prep_minutes, ingredients (array of item and amount), steps", 200),
    ("a user of a language-learning app", "username, native_language, learning (array of language and level), "
     "daily_goal_minutes, streak_days", 120),
    ("a three-day weather forecast for a coastal town", "location, days (array of date, high_c, low_c, condition, "
     "wind_kph)", 170),
    ("a hiking trail", "name, region, length_km, elevation_gain_m, difficulty (easy, moderate or hard), highlights, "
     "dog_friendly", 130),
    ("a conference talk", "title, speaker (name, affiliation), track, duration_minutes, level, abstract", 150),
    ("a laptop's specifications", "model, cpu, ram_gb, storage (type, size_gb), display (size_in, resolution), "
     "weight_kg, ports", 150),
    ("a restaurant listing", "name, cuisine, price_range, address (street, city, postcode), opening_hours, rating",
     160),
    ("a to-do list of five tasks", "tasks (array of id, title, priority, due_date, done)", 190),
    ("a product catalogue of four items", "items (array of sku, name, price, in_stock)", 170),
    ("a JSON Schema for a blog post", "title, body, tags and published_at, with types and required fields", 200),
)
_INVENT_FRAMES = ("Create a JSON object describing {what}, with the keys {keys}.",
                  "Invent {what} and return it as JSON with these keys: {keys}. Output JSON only.")
_YAML = (
    ("a docker-compose.yml with a Python web service, a PostgreSQL database and a Redis cache, with a named volume "
     "for the database", 190),
    ("a GitHub Actions workflow that runs pytest on Python 3.11 and 3.12 for every push and pull request", 170),
    ("a Kubernetes Deployment with three replicas of an nginx container, resource requests and limits, and a "
     "readiness probe", 200),
    ("an application config with sections for server (host, port), database (url, pool_size), logging (level, "
     "format) and three feature flags", 140),
    ("a Prometheus scrape configuration with two jobs: node exporters on three hosts and an application exposing "
     "/metrics on port 8000", 150),
    ("an OpenAPI 3 fragment describing GET /books/{id} with a 200 and a 404 response", 190),
    ("an Ansible playbook that installs nginx, copies a config file and restarts nginx when the file changes", 180),
    ("a Ray Serve config with one application of two deployments, one of them autoscaling between 1 and 4 "
     "replicas", 170),
    ("a pre-commit configuration with hooks for trailing whitespace, end-of-file fixing and ruff", 110),
    ("a list of the members of a five-person team, each with name, role, timezone and on-call week", 160),
    ("a Kubernetes CronJob that backs up a database every night at 02:30", 170),
)
_YAML_FRAMES = ("Write the following in YAML: {what}.", "Produce {what}. Output only the YAML.",
                "Give me {what} as YAML, with a one-line comment above each top-level key.")
_REVIEWS = ("Arrived a day early and works perfectly.", "The strap broke after two weeks.",
            "Good sound, but the app keeps disconnecting.", "Exactly as described, would buy again.",
            "Customer service never answered my emails.", "Comfortable, though a bit smaller than expected.",
            "Battery life is amazing, easily a week.", "Cheap materials; it already looks worn.",
            "Setup took five minutes and the manual was clear.", "Nice colour, terrible zip.",
            "My kids love it and so do I.", "Stopped charging after a month, returning it.",
            "Decent value for the price, nothing special.", "The lid leaks if you carry it on its side.",
            "Beautiful design, average performance.", "Fast delivery, but the box was damaged.",
            "배송이 빠르고 포장도 꼼꼼했어요.", "사진과 색상이 너무 달라요.", "가격 대비 괜찮은데 소음이 좀 있어요.",
            "두 달째 잘 쓰고 있습니다. 만족해요.", "설명서가 없어서 조립하는 데 한참 걸렸어요.",
            "디자인은 예쁜데 생각보다 무거워요.", "Works fine, but the cable is far too short.",
            "The instructions were in a language I could not read.", "Quieter than my old one, which I love.",
            "Smells strongly of plastic even after a week.", "Perfect gift; my father uses it every day.",
            "Half the screws were missing from the box.", "Does the job. No complaints, no excitement.",
            "The colour faded after the first wash.", "Surprisingly sturdy for such a light frame.",
            "재구매 의사 있어요. 가성비 최고입니다.", "버튼이 너무 뻑뻑해서 누르기 힘들어요.",
            "아이가 좋아해서 하나 더 샀어요.")


def _table(rng: random.Random, kind: int) -> tuple[str, int]:
    """A small table or document to convert, and the output budget its conversion needs."""
    rows = rng.randint(3, 5)
    if kind == 0:
        names = people(rng, rows)
        body = "\n".join(f"{n},{rng.choice(('Sales', 'Support', 'Finance', 'Design'))},{rng.randint(2015, 2025)}-"
                         f"{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}" for n in names)
        return f"Convert this CSV into a JSON array of objects:\n\nname,department,start_date\n{body}", 30 * rows + 30
    if kind == 1:
        body = "\n".join(f"{town(rng)},{rng.randint(-8, 12)},{rng.randint(16, 31)}" for _ in range(rows))
        return (f"Turn this CSV of average temperatures into JSON keyed by city, with numbers as numbers:\n\n"
                f"city,jan_c,jul_c\n{body}", 25 * rows + 30)
    if kind == 2:
        body = "\n".join(f"| {rng.randint(1000, 9999)} | {people(rng, 1)[0]} | {rng.randint(12, 480)}."
                         f"{rng.randint(0, 99):02d} | {rng.choice(('paid', 'pending', 'refunded'))} |"
                         for _ in range(rows))
        return (f"Convert this Markdown table to a JSON array:\n\n| order_id | customer | total | status |\n"
                f"|---|---|---|---|\n{body}", 35 * rows + 30)
    if kind == 3:
        port, pool = rng.choice((8000, 8080, 9000)), rng.randint(5, 30)
        return (f'Convert this JSON to YAML:\n\n{{"server": {{"host": "0.0.0.0", "port": {port}}}, "database": '
                f'{{"url": "postgres://db:5432/app", "pool_size": {pool}}}, "debug": false, "allowed_origins": '
                f'["https://example.org", "https://{town(rng).lower()}.example"]}}', 90)
    if kind == 4:
        return (f"Convert this YAML to JSON:\n\nservice: {town(rng).lower()}-api\nreplicas: {rng.randint(2, 6)}\n"
                f"resources:\n  cpu: \"{rng.choice(('500m', '1', '2'))}\"\n  memory: {rng.choice(('512Mi', '1Gi'))}\n"
                f"env:\n  - name: LOG_LEVEL\n    value: {rng.choice(('info', 'debug', 'warn'))}", 90)
    if kind == 6:
        events = "\n".join(f"- {rng.randint(1, 28)} {rng.choice(MONTHS)}: {rng.choice(_EVENTS)} in {town(rng)}"
                           for _ in range(rows))
        return f"Turn this list into a JSON array of objects with date, event and place, sorted by date:\n\n{events}", \
            30 * rows + 30
    if kind == 7:
        lines = "\n".join(f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                          f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z {rng.choice(_LOG_LINES)}"
                          for _ in range(rows))
        return (f"Parse these log lines into a JSON array of objects with the keys timestamp, level and message:"
                f"\n\n{lines}", 35 * rows + 30)
    p = people(rng, 1)[0]
    return (f"Turn these notes into one JSON object with sensible keys and types:\n\nName: {p}\nRole: "
            f"{rng.choice(('Site engineer', 'Nurse', 'Teacher', 'Chef'))}\nYears of experience: {rng.randint(2, 25)}\n"
            f"Languages: English, {rng.choice(('Spanish', 'Korean', 'Polish', 'Swahili'))}\nAvailable: "
            f"{rng.choice(MONTHS)}\nDriving licence: {rng.choice(('yes', 'no'))}", 90)


_LABEL_FRAMES = ("Label each review as positive, negative or mixed. Return a JSON array of objects with the keys "
                 "id and label, nothing else.",
                 "Classify the sentiment of these customer reviews (positive / negative / mixed) and answer with "
                 "JSON only: [{\"id\": 1, \"label\": \"...\"}, ...].",
                 "다음 상품 후기들의 감정을 positive, negative, mixed 중 하나로 분류해 JSON 배열로만 답해 주세요. "
                 "각 항목은 id와 label 키를 가집니다.")
_CONVERSIONS = tuple(range(8))  # the kinds of _table, each used at most once
_EVENTS = ("book fair", "night market", "choir concert", "charity run", "film screening", "harvest festival",
           "chess tournament", "open studio day")
_LOG_LINES = ("INFO server started on port 8080", "WARN disk usage at 85 percent",
              "ERROR payment timeout for order 5521", "INFO user 42 logged in", "DEBUG cache miss for key session:9f3",
              "ERROR connection refused by db-2", "WARN slow query took 2.4 s", "INFO nightly backup finished")
_SYSTEMS = ("You only ever reply with valid, well-indented JSON or YAML, never prose.",
            "You are an API that returns structured data. Do not wrap the output in Markdown code fences.")


def generate(rng: random.Random, n: int) -> list[dict]:
    """n prompts split over the five families in the proportions 16:10:10:8:6 (for n=50, exactly that)."""
    counts = apportion([16, 10, 10, 8, 6], n)
    extracts = _extract_sources(rng)
    if counts[0] > len(extracts) or counts[1] > len(_INVENT) or counts[2] > len(_YAML) or counts[3] > len(_CONVERSIONS):
        raise ValueError(f"structured_output: {n} prompts need more distinct tasks than the pools hold")
    tasks: list[tuple[str, int]] = []
    for kind, text, keys in rng.sample(extracts, counts[0]):
        korean = not kind.isascii()
        frame = rng.choice(_KO_EXTRACT_FRAMES if korean else _EXTRACT_FRAMES)
        tasks.append((f"{frame.format(kind=kind, keys=keys)}\n\n{text}", 30 + 14 * len(keys.split(","))))
    for what, keys, budget in rng.sample(_INVENT, counts[1]):
        tasks.append((rng.choice(_INVENT_FRAMES).format(what=what, keys=keys), budget))
    for what, budget in rng.sample(_YAML, counts[2]):
        tasks.append((rng.choice(_YAML_FRAMES).format(what=what), budget))
    tasks += [_table(rng, kind) for kind in rng.sample(_CONVERSIONS, counts[3])]
    reviews = deck(rng, _REVIEWS)
    for _ in range(counts[4]):
        picked = "\n".join(f"{i}. {next(reviews)}" for i in range(1, rng.randint(4, 6) + 1))
        tasks.append((f"{rng.choice(_LABEL_FRAMES)}\n\n{picked}", 80))
    rng.shuffle(tasks)
    out = []
    for text, budget in tasks:
        messages = [{"role": "user", "content": text}]
        if rng.random() < 0.2:
            messages.insert(0, {"role": "system", "content": rng.choice(_SYSTEMS)})
        out.append({"messages": messages, "max_tokens": clamp_round(budget, LO, HI)})
    return out
