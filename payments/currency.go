package payments

// minorUnitDigits lists the ISO 4217 currencies whose minor unit is not 1/100.
var minorUnitDigits = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0,
	"RWF": 0, "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
	"CLF": 4, "UYW": 4,
}

// MinorUnitDigits is how many decimal digits a currency's minor unit has (2 for EUR: 1999 =
// 19.99 EUR; 0 for JPY; 3 for KWD; 4 for CLF). Amounts are stored in minor units; people read and type
// them in major units.
func MinorUnitDigits(currency string) int {
	if d, ok := minorUnitDigits[currency]; ok {
		return d
	}
	return 2
}
