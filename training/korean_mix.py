"""Korean prompts for the training mix: the same kinds of task as the English mix (questions,
how-to, code, translation both ways, creative writing, structured output, summaries), written in
Korean from our own lists.

Why: 146 of bench500's 500 prompts are Korean, and a head trained on an English-only mix agreed
with the target 7.6% of the time on its answers to them (39% elsewhere; `benchmarks/head_probe.py`).
Templates avoid particles that agree with the word before them (은/는, 이/가, 을/를) by putting
slots before invariant ones (에, 의, 에서) or at the end of a clause, so every filled prompt reads
naturally. None of the benchmark's Korean prompts or topics is used (tests/test_eagle.py checks
the prompts never coincide).
"""
from __future__ import annotations

import random

KO_CONCEPTS = (
    "판 구조론", "물의 순환", "복리", "인플레이션", "수요와 공급", "백신", "블랙홀", "면역 체계", "기후 변화",
    "온실 효과", "태양광 발전", "풍력 발전", "전기 자동차", "인터넷", "암호화", "재귀 함수", "이진 탐색",
    "정렬 알고리즘", "가상 메모리", "운영체제", "데이터베이스 인덱스", "캐시", "신경망", "경사 하강법",
    "과적합", "산업 혁명", "인쇄술", "실크로드", "르네상스", "냉전", "인상주의 미술", "재즈", "교향악단",
    "체스 규칙", "올림픽", "화산", "지진", "태풍", "산호초", "열대 우림", "꿀벌과 수분", "철새의 이동",
    "식물의 성장", "심장", "수면", "영양과 단백질", "명상", "주식 시장", "채권", "신용 점수", "예산 관리",
    "재택근무", "시간 관리", "발표 능력", "협상", "리더십", "과학적 방법", "통계와 평균", "확률", "소수",
    "피타고라스 정리", "미적분", "전기", "자기장", "중력", "빛의 속도", "음파", "무지개", "조수 간만",
    "빙하", "사막", "발효", "제빵", "커피 로스팅", "퇴비 만들기", "재활용", "3D 프린팅", "블록체인",
    "양자 컴퓨터", "GPS", "배터리", "전자레인지", "냉장고", "비행기 날개", "잠수함", "다리 건설", "고층 빌딩",
    "눈의 구조", "기억과 학습", "아이의 언어 습득", "공룡", "진화론", "한글의 창제", "김치 발효", "온돌",
    "전통 한옥", "사계절의 변화", "지하철 노선도", "분리수거", "택배 물류", "반도체", "스마트폰 배터리",
)

KO_AUDIENCES = ("초등학생", "고등학생", "초보자", "전문가", "바쁜 직장인", "할머니")

KO_QUESTION_STEMS = (
    "{c}에 대해 설명해 주세요.", "{c}의 원리를 간단히 알려 주세요.", "{c}에 관한 재미있는 사실 세 가지를 알려 주세요.",
    "{a}에게 {c}에 대해 쉽게 설명해 주세요.", "{c}의 장점과 단점은 무엇인가요?", "{c}의 역사를 짧게 요약해 주세요.",
    "{c}에 대해 사람들이 흔히 오해하는 점은 무엇인가요?", "{c}에 대해 한 문단으로 써 주세요.",
    "{c}에 대해 처음 배우는 사람이 알아야 할 것은 무엇인가요?", "{c}의 핵심 개념을 요약해 주세요.",
    "{c}에 대해 두 문장으로 답해 주세요.", "왜 {c}에 관심을 가져야 하나요?",
)

KO_TASKS = (
    "자전거 타이어 교체하기", "베란다 텃밭 시작하기", "어른이 되어 외국어 배우기", "면접 준비하기",
    "자기소개서 쓰기", "작은 옷장 정리하기", "토마토 소스 만들기", "강아지에게 앉아 가르치기",
    "파이썬 가상 환경 만들기", "휴대폰 사진 백업하기", "전기 요금 줄이기", "화분 식물 키우기",
    "처음으로 5킬로미터 달리기", "장보기 비용 아끼기", "아이 생일 파티 준비하기", "수학 시험 공부하기",
    "교수님께 이메일 쓰기", "무쇠 팬 관리하기", "핸드드립 커피 내리기", "코딩용 노트북 고르기",
    "잠을 빨리 드는 법 익히기", "책을 더 많이 읽기", "가계부 만들기", "느린 웹 페이지 디버깅하기",
)

KO_TASK_STEMS = ("{t}의 방법을 단계별로 알려 주세요.", "{t}에 필요한 팁 다섯 가지를 알려 주세요.",
                 "{t}에서 흔히 하는 실수는 무엇인가요?", "{t}에 대해 간단한 체크리스트를 만들어 주세요.")

KO_CODE_SPECS = (
    "문장의 단어 순서를 뒤집는", "문자열의 모음 개수를 세는", "세 수 중 가장 큰 수를 돌려주는", "소수인지 확인하는",
    "n의 계승을 계산하는", "정렬된 두 리스트를 합치는", "순서를 유지하며 중복을 없애는", "섭씨를 화씨로 바꾸는",
    "가장 자주 나온 단어를 찾는", "중첩 리스트를 펼치는", "두 정수의 최대공약수를 구하는", "윤년인지 판별하는",
    "행렬을 전치하는", "십진수를 이진수로 바꾸는", "리스트를 k칸 회전하는", "정수의 각 자릿수 합을 구하는",
    "텍스트 파일의 줄 수를 세는", "임의의 비밀번호를 만드는", "리스트의 누적 합을 구하는", "두 문자열이 애너그램인지 확인하는",
)

KO_CODE_LANGS = ("파이썬", "파이썬", "자바스크립트", "자바", "Go", "C++", "러스트")

KO_CODE_STEMS = ("{spec} {lang} 함수를 작성해 주세요.", "{spec} {lang} 함수를 작성하고 동작 원리를 설명해 주세요.",
                 "{spec} 함수를 {lang}로 구현하고 사용 예시를 보여 주세요.", "{spec} {lang} 함수의 단위 테스트를 작성해 주세요.")

KO_SENTENCES = (
    "도서관은 일요일에 일찍 문을 닫습니다.", "기차역이 어디에 있는지 알려 주시겠어요?", "우유를 넣은 커피 한 잔 주세요.",
    "내일 비가 오지 않으면 바다에 갈 거예요.", "제 동생은 큰 병원에서 간호사로 일합니다.", "박물관에 오래된 동전 전시가 새로 열렸어요.",
    "방을 나갈 때 불을 꺼 주세요.", "이 국에는 소금이 조금 더 필요해요.", "아이들은 저녁 먹을 때까지 공원에서 놀았어요.",
    "이 재킷은 얼마예요?", "저는 이 년째 기타를 배우고 있어요.", "새 소프트웨어 업데이트가 여러 버그를 고쳤습니다.",
    "우리 팀이 마지막 순간에 경기를 이겼어요.", "매일 물을 충분히 마시는 것이 중요합니다.", "폭풍 때문에 비행기가 지연되었습니다.",
    "그녀는 매주 책을 한 권씩 읽어요.", "회의를 다음 주 월요일로 옮길 수 있을까요?", "오월이 되면 정원이 꽃으로 가득해요.",
    "사무실에 열쇠를 두고 왔어요.", "어제 도와주셔서 정말 고맙습니다.", "주말마다 부모님 댁에 들러요.",
    "새로 생긴 빵집의 크루아상이 정말 맛있어요.", "버스가 또 늦게 와서 걸어가기로 했어요.", "다음 달에 이사를 갈 예정입니다.",
)

ENGLISH_SENTENCES = (
    "The library closes early on Sundays.", "Could you tell me where the train station is?",
    "We are going to the beach tomorrow if it does not rain.", "The new software update fixes several bugs.",
    "It is important to drink enough water every day.", "Can we reschedule our call to next Monday?",
    "My neighbour grows tomatoes on her balcony.", "The concert was cancelled because of the storm.",
    "Please send me the report by Friday afternoon.", "He has been learning to cook for a year.",
    "The museum is free on the first Sunday of every month.", "Our flight leaves at seven in the morning.",
)

KO_FORMS = ("시", "짧은 이야기", "일기", "편지", "수필", "동화", "노래 가사", "짧은 대화문", "광고 문구", "여행기")

KO_SUBJECTS = (
    "하늘을 나는 고양이", "오래된 책방", "가을의 첫날", "요리를 배우는 로봇", "밤의 도시", "잃어버린 우산", "우정",
    "산골 마을", "비 오는 오후", "불을 무서워하는 용", "졸업식 날", "기차 여행", "봄의 정원", "작은 섬",
    "발명가의 작업실", "잊힌 바이올린", "휴가를 떠난 펭귄", "북적이는 시장", "시간 여행자의 아침", "달", "강",
    "용감한 생쥐", "겨울 안개", "우주인의 편지", "말하는 나무", "갓 구운 빵 냄새", "자전거",
)

KO_ENTITIES = (("영화", "제목, 감독, 개봉 연도, 주연 배우"), ("요리법", "이름, 인분, 재료, 순서"),
               ("직원", "이름, 직책, 부서, 입사일"), ("자동차", "제조사, 모델, 연식, 연료"),
               ("도시", "이름, 국가, 인구, 명소"), ("노트북", "브랜드, CPU, 메모리, 가격"),
               ("식당", "이름, 음식 종류, 평점, 주소"), ("강의", "제목, 강사, 학점, 주제"))

KO_SYSTEMS = ("당신은 친절한 도우미입니다.", "짧고 정확하게 답하세요.", "당신은 친절한 선생님입니다.",
              "모든 답변은 한국어로 하세요.")


def _document(rng: random.Random, paras: list[str]) -> str:
    """An English documentation passage (to summarize in Korean) or a few Korean sentences."""
    if paras and rng.random() < 0.6:
        return "\n\n".join(rng.sample(paras, k=min(len(paras), rng.randint(1, 3))))
    return " ".join(rng.sample(KO_SENTENCES, k=rng.randint(5, 9)))


def korean_prompt(rng: random.Random, paras: list[str]) -> str:
    """One Korean chat prompt; ``paras``: English passages (stdlib docstrings) to summarize."""
    kind = rng.choices(range(7), weights=(30, 10, 12, 18, 12, 8, 10))[0]
    if kind == 0:
        return rng.choice(KO_QUESTION_STEMS).format(c=rng.choice(KO_CONCEPTS), a=rng.choice(KO_AUDIENCES))
    if kind == 1:
        return rng.choice(KO_TASK_STEMS).format(t=rng.choice(KO_TASKS))
    if kind == 2:
        return rng.choice(KO_CODE_STEMS).format(spec=rng.choice(KO_CODE_SPECS), lang=rng.choice(KO_CODE_LANGS))
    if kind == 3:
        if rng.random() < 0.5:
            return rng.choice(("다음 문장을 영어로 번역해 주세요: {}", "영어로 자연스럽게 옮겨 주세요.\n\n{}",
                               "Translate into English: {}")).format(rng.choice(KO_SENTENCES))
        return rng.choice(("다음 문장을 한국어로 번역해 주세요: {}", "Translate this sentence into Korean: {}",
                           "한국어로 옮겨 주세요.\n\n{}")).format(rng.choice(ENGLISH_SENTENCES))
    if kind == 4:
        return rng.choice(("주제: {s}. 이 주제로 {f} 한 편을 써 주세요.", "{s}에 관한 {f} 한 편을 써 주세요.",
                           "{f} 형식으로 {s}에 대해 써 주세요.")).format(s=rng.choice(KO_SUBJECTS), f=rng.choice(KO_FORMS))
    if kind == 5:
        e, fields = rng.choice(KO_ENTITIES)
        return rng.choice((f"{e} 정보를 JSON 객체로 만들어 주세요. 필드: {fields}.",
                           f"{e} 예시를 YAML로 작성해 주세요 ({fields}).",
                           f"{e} 세 개를 표로 정리해 주세요. 열: {fields}."))
    doc = _document(rng, paras)
    return rng.choice((f"다음 글을 한국어로 세 문장 안에 요약해 주세요.\n\n{doc}",
                       f"다음 글의 핵심을 한국어 글머리표로 정리해 주세요.\n\n{doc}",
                       f"Summarize the following text in Korean.\n\n{doc}"))


def korean_system(rng: random.Random) -> str:
    return rng.choice(KO_SYSTEMS)
