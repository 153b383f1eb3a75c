"""Korean helpers: particles that agree with the word before them, and Korean name pools.

A Korean particle depends on whether the preceding syllable ends in a consonant (받침): 도서관은,
카페는. Templates that put a slot before a particle call `josa` so the filled sentence reads
naturally whatever name lands in the slot."""
from __future__ import annotations

import random

# Final-consonant reading of digits (일, 삼, 육, 칠, 팔, 십 end in a consonant; 이, 사, 오, 구 do not).
_DIGIT_FINAL = {"0": "ㅇ", "1": "ㄹ", "2": "", "3": "ㅁ", "4": "", "5": "", "6": "ㄱ", "7": "ㄹ",
                "8": "ㄹ", "9": ""}
_PAIRS = {"은/는", "이/가", "을/를", "으로/로", "이라는/라는"}


def _final(word: str) -> str:
    """'' when the last syllable has no final consonant, 'ㄹ' for a rieul final, else 'C'."""
    last = word.rstrip()[-1]
    if last.isdigit():
        return _DIGIT_FINAL[last]
    code = ord(last) - 0xAC00
    if not 0 <= code < 11172:
        raise ValueError(f"josa: cannot decide the particle after {word!r}; end the slot in Hangul or a digit")
    jong = code % 28
    return "" if jong == 0 else ("ㄹ" if jong == 8 else "C")


def josa(word: str, pair: str) -> str:
    """word + the particle of `pair` ('은/는', '이/가', '을/를', '으로/로', '이라는/라는') that agrees
    with it. 으로/로 takes 로 after a rieul final too (서울로, 지하철로)."""
    if pair not in _PAIRS:
        raise ValueError(f"josa: unknown particle pair {pair!r}; use one of {sorted(_PAIRS)}")
    with_final, without = pair.split("/")
    final = _final(word)
    if pair == "으로/로":
        return word + (without if final in ("", "ㄹ") else with_final)
    return word + (without if final == "" else with_final)


def particle(word: str, pair: str) -> str:
    """Only the agreeing particle, for when a closing quote sits between word and particle: '이사'라는."""
    return josa(word, pair)[len(word):]


KO_SURNAMES = ("김", "이", "박", "최", "정", "강", "조", "윤", "장", "임", "한", "오", "서", "신", "권", "황")
KO_GIVEN = ("민준", "서연", "지호", "하윤", "도현", "수빈", "예린", "준서", "지우", "현우", "다은", "태윤",
            "소희", "건우", "유나", "승민", "채원", "재희", "은서", "시우")
KO_CITIES = ("서울", "부산", "대구", "인천", "광주", "대전", "울산", "수원", "전주", "춘천", "강릉", "제주",
             "청주", "포항", "여수", "목포", "안동", "경주")
KO_DISTRICTS = ("햇살동", "푸른숲동", "은행나무동", "솔바람동", "강변동", "별빛동", "새봄동", "한울동",
                "노을동", "맑은샘동")


def ko_people(rng: random.Random, n: int) -> list[str]:
    """n different Korean full names."""
    given = rng.sample(KO_GIVEN, n)
    return [rng.choice(KO_SURNAMES) + g for g in given]
